#!/usr/bin/env bash
# Builds the Worker (Rust -> wasm) into build/ with worker-build. wrangler.toml's [build] command
# runs this, so `npx wrangler dev` / `wrangler deploy` need nothing else once scripts/setup-dev.sh ran.
#
#   bash scripts/build-worker.sh          build unless build/ is newer than every source
#   FANOUT_FORCE_BUILD=1 ...              always build
#   FANOUT_SKIP_BUILD=1 ...               never build; use the existing build/ (the e2e harness
#                                         sets this so each `wrangler dev` start is instant)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/env.sh
. scripts/env.sh

say() { printf 'build-worker: %s\n' "$*" >&2; }
die() { printf 'build-worker: error: %s\n' "$*" >&2; exit 1; }

out="build/index.js"

if [ "${FANOUT_SKIP_BUILD:-}" = "1" ]; then
  [ -f "$out" ] || die "FANOUT_SKIP_BUILD=1 but $out does not exist; run 'bash scripts/build-worker.sh' first"
  say "skip: FANOUT_SKIP_BUILD=1, using existing build/"
  exit 0
fi

if [ "${FANOUT_FORCE_BUILD:-}" != "1" ] && [ -f "$out" ] && [ -f build/index_bg.wasm ]; then
  newer="$(find src Cargo.toml Cargo.lock -newer "$out" -print -quit 2>/dev/null || true)"
  if [ -z "$newer" ]; then
    say "skip: build/ is newer than src/, Cargo.toml and Cargo.lock"
    exit 0
  fi
fi

command -v worker-build >/dev/null 2>&1 \
  || die "worker-build not found; run 'bash scripts/setup-dev.sh' first"
[ -x "$WASM_BINDGEN_BIN" ] \
  || die "wasm-bindgen CLI not found at $WASM_BINDGEN_BIN; run 'bash scripts/setup-dev.sh' first"

say "worker-build --release (wasm-bindgen: $WASM_BINDGEN_BIN)"
worker-build --release
[ -f "$out" ] || die "worker-build finished but $out is missing"
# worker-build keeps old mtimes on unchanged outputs; mark the build as fresh for the check above.
touch "$out"
