#!/usr/bin/env bash
# Runs every check and test: formatting, clippy (native and wasm), the manual (built, its links
# checked), the Rust unit and integration tests, then the end-to-end tests against the built Worker (wrangler dev) and the origin daemon,
# then a short fault soak (bench/chaos.mjs).
# Stops at the first failure. CI runs exactly this (via .ci/run).
#
#   bash scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."

current_step=""
started=$SECONDS
on_exit() {
  local status=$?
  if [ "$status" -ne 0 ] && [ -n "$current_step" ]; then
    printf '\n==> FAILED (exit %s) at step: %s\n' "$status" "$current_step" >&2
  fi
}
trap on_exit EXIT

step() { # name command...
  current_step="$1"
  shift
  printf '\n==> %s\n' "$current_step"
  printf '    $ %s\n' "$*"
  "$@"
}

step "setup (install missing tools, the test tools too)" bash scripts/setup.sh
# shellcheck source=scripts/env.sh
. scripts/env.sh
# A run from a clean checkout gains nothing from incremental compilation, whose caches took
# 1.9 GB of the 6.2 GB a run used before (see Cargo.toml's [profile.dev]).
export CARGO_INCREMENTAL=0

step "format" cargo fmt --all --check
# mdBook does not fail on a broken link: scripts/check-docs.mjs resolves every relative link and
# #anchor of docs/src (and of the READMEs that lead into it). The commands the book shows are
# checked against the binary by origin/tests/docs_cli.rs, in the Rust tests below.
step "the manual (mdbook build docs)" mdbook build docs
step "the manual's links (scripts/check-docs.mjs)" node scripts/check-docs.mjs
step "clippy (native, all targets)" cargo clippy --workspace --all-targets -- -D warnings
step "clippy (wasm32, fanout-core + Worker)" \
  cargo clippy --target wasm32-unknown-unknown -p fanout-core -- -D warnings
step "rust tests (unit + integration)" cargo test --workspace
step "the daemon's integration tests again, on a PostgreSQL ledger" \
  env FANOUT_TEST_LEDGER=postgres cargo test -p fanout-origin --test daemon --test alerts --test operators --test customers --test tenants --test filters --test ordering
step "build origin binary for the e2e tests" cargo build -p fanout-origin
step "build the Worker (worker-build --release)" bash scripts/build-worker.sh
step "deploy dry run (wrangler bundle, gzipped size within the Free plan's 3 MiB)" \
  bash scripts/deploy-check.sh

export FANOUT_BIN="$PWD/target/debug/fanout"
export FANOUT_SKIP_BUILD=1
# package.json's test:e2e: a test that hangs fails after 5 minutes (the longest takes about 45 s),
# and a file whose tests are done exits even if something it started is still running, so a run
# ends, red or green, instead of waiting for CI's time limit.
step "end-to-end tests (node --test)" npm run --silent test:e2e
# The packages (scripts/package-test.sh): one release build of the static (musl) binary, the
# .deb installed, run as its unit says, upgraded and removed with dpkg, and the container image
# run from its own filesystem under chroot (skipped, loudly, without buildah). Needs root.
step "packages: static binary, .deb (dpkg -i, upgrade, remove), image (buildah)" \
  bash scripts/package-test.sh
# The fault soak, short, with a fixed seed (bench/chaos.mjs; about 2.5 minutes in all): two
# daemons on a throwaway PostgreSQL, the Worker, the outbox and every kind of subscriber under
# the faults seed 36 orders first (a cut network, an edge restart, a PostgreSQL restart, kill -9,
# SIGSTOP; as many as two minutes hold). It exits 1 on a lost event, an arrival over a strict
# partner's rate, duplicates over their bound, or a delivery of an acknowledged event that does
# not finish in the drain, printing the seed and the history around it.
step "fault soak, 2 minutes (bench/chaos.mjs --seed 36)" \
  node bench/chaos.mjs --minutes 2 --seed 36 --ledger pg

current_step=""
printf '\n==> all checks and tests passed in %ss\n' "$((SECONDS - started))"
