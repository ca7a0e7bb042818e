#!/usr/bin/env bash
# Proves the Worker deploys, as far as can be told without a Cloudflare account:
#   - every secret the Worker reads (`.secret("NAME")` in src/) is listed on wrangler.toml's
#     `# secrets:` line (what the deployment guide tells people to `wrangler secret put`), and
#     none is a plain [vars] entry (a var is uploaded in clear and shown in the dashboard);
#   - the Durable Object binding the Worker uses (DO_BINDING in src/edge/mod.rs) is declared,
#     its class is the Worker's #[durable_object] struct, and a [[migrations]] entry with a
#     unique tag creates that class (a first deploy without one fails);
#   - `wrangler deploy --dry-run` bundles build/ exactly as a deploy would (no login needed,
#     nothing uploaded) and names that binding; the bundle's gzipped size is printed and
#     checked against the Free plan's limit (3 MiB compressed; 10 MiB on Workers Paid).
#
#   bash scripts/deploy-check.sh          (scripts/test.sh runs it after building the Worker)
set -euo pipefail
cd "$(dirname "$0")/.."

limit=$((3 * 1024 * 1024))
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

# What the Worker's code reads, found in its source.
read_secrets="$(grep -rhoE '\.secret\("[A-Z0-9_]+"\)' src | sed -E 's/.*"([A-Z0-9_]+)".*/\1/' | sort -u)"
binding="$(sed -nE 's/^const DO_BINDING: &str = "([A-Za-z0-9_]+)";/\1/p' src/edge/mod.rs)"
do_class="$(grep -A2 -h '^#\[durable_object\]' src/edge/*.rs | sed -nE 's/^pub struct ([A-Za-z0-9_]+).*/\1/p')"
[ -n "$read_secrets" ] || { echo "deploy-check: found no .secret(\"...\") in src/ (has the Worker's code moved?)" >&2; exit 1; }
[ -n "$binding" ] && [ -n "$do_class" ] \
  || { echo "deploy-check: cannot find DO_BINDING or the #[durable_object] struct in src/edge/" >&2; exit 1; }

READ_SECRETS="$read_secrets" BINDING="$binding" DO_CLASS="$do_class" python3 - <<'PY'
import os, re, sys, tomllib

text = open("wrangler.toml", encoding="utf-8").read()
conf = tomllib.loads(text)
problems = []

listed = set()
for m in re.finditer(r"^# secrets: (.*)$", text, re.M):
    listed |= set(m.group(1).split())
read = set(os.environ["READ_SECRETS"].split())
for name in sorted(read - listed):
    problems.append(f"the Worker reads the secret {name}, not on wrangler.toml's '# secrets:' line")
for name in sorted(listed - read):
    problems.append(f"wrangler.toml lists the secret {name}, which the Worker never reads")
for name in sorted(read & set(conf.get("vars", {}))):
    problems.append(f"the secret {name} is also a plain [vars] entry (uploaded in clear)")

binding, cls = os.environ["BINDING"], os.environ["DO_CLASS"]
bindings = {b["name"]: b["class_name"] for b in conf.get("durable_objects", {}).get("bindings", [])}
if bindings.get(binding) != cls:
    problems.append(f"no [[durable_objects.bindings]] name = {binding!r}, class_name = {cls!r} (found {bindings})")
migrations = conf.get("migrations", [])
tags = [m.get("tag") for m in migrations]
if not tags or None in tags or len(set(tags)) != len(tags):
    problems.append(f"[[migrations]] need unique tags (found {tags})")
created = [c for m in migrations for c in m.get("new_sqlite_classes", []) + m.get("new_classes", [])]
if cls not in created:
    problems.append(f"no [[migrations]] entry creates {cls} (new_sqlite_classes)")

for p in problems:
    print(f"deploy-check: {p}", file=sys.stderr)
if problems:
    sys.exit(1)
print(f"deploy-check: secrets {' '.join(sorted(read))} listed; {binding} -> {cls} created by migration "
      f"{next(m['tag'] for m in migrations if cls in m.get('new_sqlite_classes', []) + m.get('new_classes', []))}")
PY

FANOUT_SKIP_BUILD=1 WRANGLER_SEND_METRICS=false CLOUDFLARE_CF_FETCH_ENABLED=false \
  WRANGLER_LOG_PATH="$out/.logs" \
  node node_modules/wrangler/bin/wrangler.js deploy --dry-run --outdir "$out/bundle" | tee "$out/dry-run.txt"
grep -q "env\.$binding" "$out/dry-run.txt" \
  || { echo "deploy-check: the dry run does not bind env.$binding" >&2; exit 1; }

[ -f "$out/bundle/index.js" ] || { echo "deploy-check: no bundle in $out/bundle" >&2; exit 1; }
raw=$(tar -C "$out/bundle" -cf - . | wc -c)
gz=$(tar -C "$out/bundle" -cf - . | gzip -9 | wc -c)
printf 'deploy-check: bundle %s bytes, gzipped %s bytes (%s MiB); Free plan limit %s bytes\n' \
  "$raw" "$gz" "$(awk -v b="$gz" 'BEGIN { printf "%.3f", b / 1048576 }')" "$limit"
if [ "$gz" -gt "$limit" ]; then
  echo "deploy-check: the gzipped bundle exceeds the Free plan's 3 MiB" >&2
  exit 1
fi
