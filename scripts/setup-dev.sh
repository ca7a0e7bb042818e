#!/usr/bin/env bash
# Installs what running Fanout needs (scripts/dev.sh, `npm run deploy`), skipping whatever is
# already in place: the wasm32 target, worker-build, the wasm-bindgen CLI at the version
# Cargo.lock pins, and the npm packages (wrangler). Only rustup, `cargo install` and `npm ci`:
# never apt-get or pip, so it runs on any Linux or macOS with rustup and Node.js. The test
# tools are scripts/setup.sh's. Safe to run any number of times; needs crates.io and the npm
# registry only when something is missing.
#
#   bash scripts/setup-dev.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/env.sh
. scripts/env.sh

WORKER_BUILD_VERSION="0.8.7"
WASM_TARGET="wasm32-unknown-unknown"

say() { printf 'setup: %s\n' "$*"; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

for tool in cargo rustup node npm curl; do
  command -v "$tool" >/dev/null 2>&1 || die "'$tool' is not on PATH; install Rust (rustup), Node.js >= 20.3 and curl first"
done

# --- Rust toolchain pieces -------------------------------------------------------------------
if rustup target list --installed | grep -qx "$WASM_TARGET"; then
  say "skip: rust target $WASM_TARGET already installed"
else
  say "installing rust target $WASM_TARGET"
  rustup target add "$WASM_TARGET"
fi

# --- worker-build ----------------------------------------------------------------------------
have_wb="$(worker-build --version 2>/dev/null | awk '{print $NF}' || true)"
if [ "$have_wb" = "$WORKER_BUILD_VERSION" ]; then
  say "skip: worker-build $WORKER_BUILD_VERSION already installed"
else
  say "installing worker-build $WORKER_BUILD_VERSION (found: ${have_wb:-none}); this compiles from source, a few minutes"
  cargo install worker-build --version "$WORKER_BUILD_VERSION" --force
fi

# --- wasm-bindgen CLI at exactly the library version in Cargo.lock ---------------------------
if [ ! -f Cargo.lock ]; then
  say "Cargo.lock missing: generating it"
  cargo generate-lockfile
fi
# The version of the package named exactly "wasm-bindgen" (not -macro, -shared, ...).
wbg_version="$(awk '
  /^\[\[package\]\]/ { name = "" }
  /^name = / { name = $3; gsub(/"/, "", name) }
  /^version = / && name == "wasm-bindgen" { v = $3; gsub(/"/, "", v); print v; exit }
' Cargo.lock)"
[ -n "$wbg_version" ] || die "no wasm-bindgen package in Cargo.lock (is worker a wasm32 dependency in Cargo.toml?)"

have_wbg="$("$WASM_BINDGEN_BIN" --version 2>/dev/null | awk '{print $2}' || true)"
if [ "$have_wbg" = "$wbg_version" ]; then
  say "skip: wasm-bindgen-cli $wbg_version already installed ($WASM_BINDGEN_BIN)"
else
  say "installing wasm-bindgen-cli $wbg_version to match Cargo.lock (found: ${have_wbg:-none}); a few minutes"
  cargo install wasm-bindgen-cli --version "$wbg_version" --force
  have_wbg="$("$WASM_BINDGEN_BIN" --version 2>/dev/null | awk '{print $2}' || true)"
  [ "$have_wbg" = "$wbg_version" ] \
    || die "WASM_BINDGEN_BIN=$WASM_BINDGEN_BIN reports '${have_wbg:-nothing}', expected $wbg_version"
fi

# --- npm packages (wrangler, standardwebhooks) -----------------------------------------------
# node_modules is current when it was installed from exactly this package.json + lockfile.
npm_stamp_file="node_modules/.fanout-npm-stamp"
if [ -f package-lock.json ]; then
  want_stamp="$(cat package.json package-lock.json | cksum)"
else
  want_stamp="$(cksum < package.json)"
fi
have_stamp="$(cat "$npm_stamp_file" 2>/dev/null || true)"
if [ "$have_stamp" = "$want_stamp" ] && [ -x node_modules/.bin/wrangler ]; then
  say "skip: node_modules is up to date"
else
  if [ -f package-lock.json ]; then
    say "installing npm packages (npm ci)"
    npm ci --no-audit --no-fund
  else
    say "installing npm packages (npm install: no package-lock.json yet)"
    npm install --no-audit --no-fund
    want_stamp="$(cat package.json package-lock.json | cksum)"
  fi
  printf '%s\n' "$want_stamp" > "$npm_stamp_file"
fi

say "ready to run: worker-build $(worker-build --version), $("$WASM_BINDGEN_BIN" --version), wrangler $(node_modules/.bin/wrangler --version 2>/dev/null | tail -n 1), node $(node --version)"
