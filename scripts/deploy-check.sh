#!/usr/bin/env bash
# Proves the Worker deploys: `wrangler deploy --dry-run` bundles build/ exactly as a deploy would
# (no login needed, nothing uploaded), then the bundle's gzipped size is printed and checked
# against the Free plan's limit (3 MiB compressed; 10 MiB on Workers Paid).
#
#   bash scripts/deploy-check.sh          (scripts/test.sh runs it after building the Worker)
set -euo pipefail
cd "$(dirname "$0")/.."

limit=$((3 * 1024 * 1024))
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

FANOUT_SKIP_BUILD=1 WRANGLER_SEND_METRICS=false CLOUDFLARE_CF_FETCH_ENABLED=false \
  WRANGLER_LOG_PATH="$out/.logs" \
  node node_modules/wrangler/bin/wrangler.js deploy --dry-run --outdir "$out/bundle"

[ -f "$out/bundle/index.js" ] || { echo "deploy-check: no bundle in $out/bundle" >&2; exit 1; }
raw=$(tar -C "$out/bundle" -cf - . | wc -c)
gz=$(tar -C "$out/bundle" -cf - . | gzip -9 | wc -c)
printf 'deploy-check: bundle %s bytes, gzipped %s bytes (%s MiB); Free plan limit %s bytes\n' \
  "$raw" "$gz" "$(awk -v b="$gz" 'BEGIN { printf "%.3f", b / 1048576 }')" "$limit"
if [ "$gz" -gt "$limit" ]; then
  echo "deploy-check: the gzipped bundle exceeds the Free plan's 3 MiB" >&2
  exit 1
fi
