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
# The one release build; the tests make the .deb and the image from it (scripts/package.sh
# --no-build), each as often as they need.
bash scripts/package.sh --binary
echo "package-test: static release binary built in $((SECONDS - started))s"
command -v buildah >/dev/null 2>&1 \
  || printf '%s\n' "package-test: WARNING: buildah is missing: the image is NOT built or tested" >&2
node --test --test-concurrency=1 --test-timeout=300000 tests/packaging/deb.mjs tests/packaging/image.mjs
echo "package-test: done in $((SECONDS - started))s"
