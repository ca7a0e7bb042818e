#!/usr/bin/env bash
# Builds the static release binary once (scripts/package.sh), then tests what ships from it:
#   tests/packaging/deb.mjs    the .deb: dpkg -i, the unit's own ExecStart as the fanout user, a
#                              signed webhook, an upgrade keeping ledger and settings, remove, purge
#   tests/packaging/image.mjs  the image: its own filesystem under chroot as its user, a signed
#                              webhook, its HEALTHCHECK (skipped, loudly, without buildah)
# Needs root (dpkg -i, useradd, buildah mount, chroot). scripts/test.sh runs it.
#
#   bash scripts/package-test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/env.sh
. scripts/env.sh

[ "$(id -u)" -eq 0 ] || { echo "package-test: needs root (dpkg -i, chroot)" >&2; exit 1; }
started=$SECONDS
if command -v buildah >/dev/null 2>&1; then
  bash scripts/package.sh
else
  printf '%s\n' "package-test: WARNING: buildah is missing: the image is NOT built or tested" >&2
  bash scripts/package.sh --deb
fi
echo "package-test: binary and packages built in $((SECONDS - started))s"
node --test --test-concurrency=1 --test-timeout=300000 tests/packaging/deb.mjs tests/packaging/image.mjs
echo "package-test: done in $((SECONDS - started))s"
