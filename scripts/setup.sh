#!/usr/bin/env bash
# Installs everything Fanout needs to build, run and test, skipping whatever is already in place.
# Safe to run any number of times; needs crates.io, the npm registry, PyPI (schemathesis) and,
# only when Chromium is missing, Debian's apt.
#
#   bash scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/env.sh
. scripts/env.sh

WORKER_BUILD_VERSION="0.8.7"
WASM_TARGET="wasm32-unknown-unknown"

say() { printf 'setup: %s\n' "$*"; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

for tool in cargo rustup node npm; do
  command -v "$tool" >/dev/null 2>&1 || die "'$tool' is not on PATH; install Rust (rustup) and Node.js >= 20.3 first"
done

# --- Rust toolchain pieces -------------------------------------------------------------------
if rustup target list --installed | grep -qx "$WASM_TARGET"; then
  say "skip: rust target $WASM_TARGET already installed"
else
  say "installing rust target $WASM_TARGET"
  rustup target add "$WASM_TARGET"
fi

for component in rustfmt clippy; do
  if rustup component list --installed 2>/dev/null | grep -q "^$component"; then
    say "skip: rustup component $component already installed"
  else
    say "installing rustup component $component"
    rustup component add "$component"
  fi
done

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

# --- Chromium for the console's browser test (tests/console.test.mjs, via playwright-core) ---
CHROMIUM_BIN="/usr/bin/chromium"
if [ -x "$CHROMIUM_BIN" ]; then
  say "skip: chromium already installed ($CHROMIUM_BIN)"
else
  command -v apt-get >/dev/null 2>&1 || die "$CHROMIUM_BIN is missing and there is no apt-get: install Debian's chromium package"
  say "installing chromium (apt-get)"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update
  $sudo_cmd apt-get install -y chromium
fi

# --- PostgreSQL server binaries for the PostgreSQL ledger's tests (origin/tests/pg_ledger.rs) ---
# The tests start a throwaway server of their own (initdb into a temp dir); only the binaries
# are needed, no running service.
pg_postgres="$(ls /usr/lib/postgresql/*/bin/postgres 2>/dev/null | sort -V | tail -n 1 || true)"
if [ -n "$pg_postgres" ]; then
  say "skip: PostgreSQL server already installed ($pg_postgres)"
else
  command -v apt-get >/dev/null 2>&1 || die "no /usr/lib/postgresql/*/bin/postgres and no apt-get: install Debian's postgresql package"
  say "installing the PostgreSQL server (apt-get)"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update
  # The package starts a cluster of its own on Debian; the tests never use it.
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y postgresql
fi

# --- libfaketime for the clock-skew test (origin/tests/pg_clocks.rs) ---------------------------
# It runs daemons whose process reads a shifted time (LD_PRELOAD); only the library is needed.
faketime_lib="$(ls /usr/lib/*/faketime/libfaketime.so.1 /usr/lib/faketime/libfaketime.so.1 2>/dev/null | head -n 1 || true)"
if [ -n "$faketime_lib" ]; then
  say "skip: libfaketime already installed ($faketime_lib)"
else
  command -v apt-get >/dev/null 2>&1 || die "no libfaketime.so.1 and no apt-get: install Debian's libfaketime package"
  say "installing libfaketime (apt-get)"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y libfaketime
fi

# --- packaging (scripts/package.sh, scripts/package-test.sh) ---------------------------------
# The static binary: the musl target, and musl-gcc for the C inside it (ring, SQLite, mimalloc).
# The tests: systemd-analyze (verify and rate the unit), dpkg-deb, buildah (the image).
MUSL_TARGET="x86_64-unknown-linux-musl"
if rustup target list --installed | grep -qx "$MUSL_TARGET"; then
  say "skip: rust target $MUSL_TARGET already installed"
else
  say "installing rust target $MUSL_TARGET"
  rustup target add "$MUSL_TARGET"
fi
packaging_missing=()
command -v musl-gcc >/dev/null 2>&1 || packaging_missing+=(musl-tools)
command -v buildah >/dev/null 2>&1 || packaging_missing+=(buildah)
command -v systemd-analyze >/dev/null 2>&1 || packaging_missing+=(systemd)
command -v dpkg-deb >/dev/null 2>&1 || packaging_missing+=(dpkg)
if [ "${#packaging_missing[@]}" -eq 0 ]; then
  say "skip: musl-gcc, buildah, systemd-analyze and dpkg-deb already installed"
else
  command -v apt-get >/dev/null 2>&1 || die "missing ${packaging_missing[*]} and no apt-get: install Debian's ${packaging_missing[*]}"
  say "installing ${packaging_missing[*]} (apt-get)"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y "${packaging_missing[@]}"
fi

# --- schemathesis for the OpenAPI check (tests/openapi.test.mjs) -----------------------------
SCHEMATHESIS_VERSION="4.32.5"
have_st="$( (schemathesis --version || python3 -m schemathesis --version) 2>/dev/null | awk '{print $NF}' | tail -n 1 || true)"
if [ "$have_st" = "$SCHEMATHESIS_VERSION" ]; then
  say "skip: schemathesis $SCHEMATHESIS_VERSION already installed"
else
  command -v python3 >/dev/null 2>&1 || die "python3 is not on PATH; it is needed for schemathesis"
  say "installing schemathesis $SCHEMATHESIS_VERSION (found: ${have_st:-none})"
  python3 -m pip install --quiet "schemathesis==$SCHEMATHESIS_VERSION"
fi

say "ready: worker-build $(worker-build --version), $("$WASM_BINDGEN_BIN" --version), wrangler $(node_modules/.bin/wrangler --version 2>/dev/null | tail -n 1), node $(node --version)"
