#!/usr/bin/env bash
# Builds what Fanout ships from one release build of a static binary (musl):
#   the Debian package  target/package/fanout_<version>_amd64.deb   (dpkg-deb over a staged tree)
#   the container image localhost/fanout:<version>                   (buildah, from ./Containerfile)
#
#   bash scripts/package.sh                  binary, .deb and image
#   bash scripts/package.sh --deb            binary and .deb
#   bash scripts/package.sh --image          binary and image
#   bash scripts/package.sh --binary         the binary only
#   options: --version V (default: origin/Cargo.toml's), --no-build (reuse the binary as it is),
#            --deb-compression gzip (default xz: a third smaller, four times slower to build;
#            the tests use gzip)
#
# The binary: cargo build --release --target x86_64-unknown-linux-musl -p fanout-origin (the
# target and musl-gcc for ring, SQLite and mimalloc's C come from scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/env.sh
. scripts/env.sh

TARGET="x86_64-unknown-linux-musl"
BIN="target/$TARGET/release/fanout"
OUT="target/package"

say() { printf 'package: %s\n' "$*"; }
die() { printf 'package: error: %s\n' "$*" >&2; exit 1; }

want_deb=0 want_image=0 want_binary=0 build=1 version="" deb_compression=xz
while [ $# -gt 0 ]; do
  case "$1" in
    --deb) want_deb=1 ;;
    --image) want_image=1 ;;
    --binary) want_binary=1 ;;
    --deb-compression) deb_compression="${2:?--deb-compression needs gzip or xz}"; shift ;;
    --no-build) build=0 ;;
    --version) version="${2:?--version needs a value}"; shift ;;
    *) die "unknown argument: $1 (see the header of $0)" ;;
  esac
  shift
done
if [ "$want_deb" = 0 ] && [ "$want_image" = 0 ] && [ "$want_binary" = 0 ]; then
  want_deb=1 want_image=1
fi
case "$deb_compression" in gzip | xz) ;; *) die "--deb-compression: gzip or xz, not $deb_compression" ;; esac
if [ -z "$version" ]; then
  version="$(awk -F'"' '/^version = / { print $2; exit }' origin/Cargo.toml)"
fi
[[ "$version" =~ ^[0-9][A-Za-z0-9.+~-]*$ ]] || die "not a Debian version: $version"

if [ "$build" = 1 ]; then
  say "building the static binary (release, $TARGET)"
  started=$SECONDS
  CARGO_INCREMENTAL=0 cargo build --release --target "$TARGET" -p fanout-origin
  say "built $BIN in $((SECONDS - started))s"
fi
[ -x "$BIN" ] || die "no $BIN: run without --no-build"
# Static, or the empty image cannot run it.
if file "$BIN" 2>/dev/null | grep -q 'dynamically linked'; then
  die "$BIN is dynamically linked"
fi
mkdir -p "$OUT"

build_deb() {
  local stage="$OUT/deb-root" deb="$OUT/fanout_${version}_amd64.deb"
  rm -rf "$stage"
  install -D -m 0755 "$BIN" "$stage/usr/bin/fanout"
  install -D -m 0644 packaging/fanout.service "$stage/lib/systemd/system/fanout.service"
  install -D -m 0644 packaging/fanout.toml "$stage/etc/fanout/fanout.toml"
  install -D -m 0644 packaging/fanout.env "$stage/usr/share/fanout/fanout.env.template"
  install -D -m 0644 packaging/debian/copyright "$stage/usr/share/doc/fanout/copyright"
  install -d -m 0755 "$stage/DEBIAN"
  install -m 0644 packaging/debian/conffiles "$stage/DEBIAN/conffiles"
  install -m 0755 packaging/debian/postinst packaging/debian/prerm packaging/debian/postrm "$stage/DEBIAN/"
  local size
  size="$(du -sk --exclude=DEBIAN "$stage" | cut -f1)"
  sed -e "s/@VERSION@/$version/" -e "s/@SIZE@/$size/" packaging/debian/control > "$stage/DEBIAN/control"
  (cd "$stage" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z | xargs -0 md5sum) \
    > "$stage/DEBIAN/md5sums"
  dpkg-deb --root-owner-group "-Z$deb_compression" --build "$stage" "$deb" >/dev/null
  say "built $deb ($(du -h "$deb" | cut -f1))"
}

build_image() {
  command -v buildah >/dev/null 2>&1 || die "buildah is missing (scripts/setup.sh installs it)"
  local tag="localhost/fanout:$version"
  # The images these tags named before: untagged, they would pile up run after run.
  buildah --storage-driver vfs rmi "$tag" localhost/fanout:latest >/dev/null 2>&1 || true
  # vfs and chroot: no overlay mounts and no user namespaces needed (CI machines, containers).
  buildah --storage-driver vfs bud --isolation chroot --format docker --quiet \
    -f Containerfile -t "$tag" . >/dev/null
  buildah --storage-driver vfs tag "$tag" localhost/fanout:latest
  say "built image $tag"
}

[ "$want_deb" = 1 ] && build_deb
[ "$want_image" = 1 ] && build_image
exit 0
