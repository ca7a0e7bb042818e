#!/usr/bin/env bash
# Installs everything Fanout needs to build, run and test, skipping whatever is already in
# place: what running needs (scripts/setup-dev.sh), then the test tools — rustfmt and clippy,
# Chromium, a PostgreSQL server, libfaketime, schemathesis and mdBook. Safe to run any number of
# times; needs crates.io, the npm registry, PyPI (schemathesis) and, only when Chromium,
# PostgreSQL or libfaketime is missing, Debian's apt: the test command is written for Debian.
#
#   bash scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup-dev.sh
# shellcheck source=scripts/env.sh
. scripts/env.sh

MDBOOK_VERSION="0.4.52"

say() { printf 'setup: %s\n' "$*"; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

# apt_install WHY PACKAGE...: install Debian packages (sudo when not root; the package index is
# refreshed once per run), or stop naming what is missing where there is no apt-get.
apt_updated=0
apt_install() {
  local why="$1"
  shift
  command -v apt-get >/dev/null 2>&1 || die "$why and there is no apt-get: install Debian's $* (or your system's equivalent)"
  say "installing $* (apt-get)"
  local sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  if [ "$apt_updated" = 0 ]; then
    $sudo_cmd apt-get update
    apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y "$@"
}

# --- rustfmt and clippy (scripts/test.sh's format and lint steps) ----------------------------
for component in rustfmt clippy; do
  if rustup component list --installed 2>/dev/null | grep -q "^$component"; then
    say "skip: rustup component $component already installed"
  else
    say "installing rustup component $component"
    rustup component add "$component"
  fi
done

# --- Chromium for the console's browser test (tests/console.test.mjs, via playwright-core) ---
CHROMIUM_BIN="/usr/bin/chromium"
if [ -x "$CHROMIUM_BIN" ]; then
  say "skip: chromium already installed ($CHROMIUM_BIN)"
else
  apt_install "$CHROMIUM_BIN is missing" chromium
fi

# --- PostgreSQL server binaries for the PostgreSQL ledger's tests (origin/tests/pg_*.rs, ledger_parity.rs) ---
# The tests start a throwaway server of their own (initdb into a temp dir); only the binaries
# are needed, no running service.
pg_postgres="$(ls /usr/lib/postgresql/*/bin/postgres 2>/dev/null | sort -V | tail -n 1 || true)"
if [ -n "$pg_postgres" ]; then
  say "skip: PostgreSQL server already installed ($pg_postgres)"
else
  # The package starts a cluster of its own on Debian; the tests never use it.
  apt_install "no /usr/lib/postgresql/*/bin/postgres" postgresql
fi

# --- libfaketime for the clock-skew test (origin/tests/pg_clocks.rs) ---------------------------
# It runs daemons whose process reads a shifted time (LD_PRELOAD); only the library is needed.
faketime_lib="$(ls /usr/lib/*/faketime/libfaketime.so.1 /usr/lib/faketime/libfaketime.so.1 2>/dev/null | head -n 1 || true)"
if [ -n "$faketime_lib" ]; then
  say "skip: libfaketime already installed ($faketime_lib)"
else
  apt_install "no libfaketime.so.1" libfaketime
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
  apt_install "missing ${packaging_missing[*]}" "${packaging_missing[@]}"
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

# --- mdBook for the manual (docs/; scripts/test.sh builds it and checks its links) -------------
# Without its `serve` and `watch` features: the book is only built here, and those would add a
# web server and a file watcher to compile.
have_mdbook="$(mdbook --version 2>/dev/null | awk '{print $2}' | tr -d v || true)"
if [ "$have_mdbook" = "$MDBOOK_VERSION" ]; then
  say "skip: mdbook $MDBOOK_VERSION already installed"
else
  say "installing mdbook $MDBOOK_VERSION (found: ${have_mdbook:-none}); this compiles from source, a few minutes"
  cargo install mdbook --version "$MDBOOK_VERSION" --locked --no-default-features --features search --force
fi

say "ready to test: rustfmt, clippy, chromium, PostgreSQL, libfaketime, schemathesis $SCHEMATHESIS_VERSION, mdbook $(mdbook --version | awk '{print $2}')"
