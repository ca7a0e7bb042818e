#!/usr/bin/env bash
# Starts everything for local development: the Worker under `wrangler dev` and the origin daemon
# pointed at it. Ctrl-C stops both.
#
#   bash scripts/dev.sh                  # install what is missing, build, start both
#   bash scripts/dev.sh --print-binary   # only print where the release `fanout` is (or will be)
#
# Edge on 127.0.0.1:${EDGE_PORT:-8787}, origin on 127.0.0.1:${ORIGIN_PORT:-8080}, ledger ./fanout.db.
# The edge key lives in .dev.vars (created on first run) and the API token in
# .wrangler/fanout-dev-api-token (or $FANOUT_API_TOKEN); both are reused on later runs and reach
# the daemon in its environment (FANOUT_EDGE_KEY, FANOUT_API_TOKEN), never on its command line,
# which `ps` shows to every user.
#
# Runs on Linux and macOS with bash (3.2 or later), curl, rustup and Node.js: it installs only
# what running needs (scripts/setup-dev.sh: rustup, cargo install, npm ci; never apt-get or pip).
# The build honours CARGO_TARGET_DIR (and a target-dir in Cargo's config): the binary is found
# where Cargo says its target directory is.
set -euo pipefail
cd "$(dirname "$0")/.."

EDGE_PORT="${EDGE_PORT:-8787}"
ORIGIN_PORT="${ORIGIN_PORT:-8080}"
STARTUP_TIMEOUT_S="${STARTUP_TIMEOUT_S:-180}"

say() { printf 'dev: %s\n' "$*"; }
die() { printf 'dev: error: %s\n' "$*" >&2; exit 1; }

# The release binary of fanout-origin: <target directory>/release/fanout, the target directory as
# `cargo metadata` reports it (CARGO_TARGET_DIR, build.target-dir, or ./target).
release_binary() {
  local dir
  dir="$(cargo metadata --format-version 1 --no-deps \
    | node -e 'let s = ""; process.stdin.on("data", (d) => (s += d)).on("end", () => console.log(JSON.parse(s).target_directory))')" \
    || die "cargo metadata failed: cannot tell where the build goes"
  [ -n "$dir" ] || die "cargo metadata named no target directory"
  printf '%s/release/fanout\n' "$dir"
}

if [ "${1:-}" = "--print-binary" ]; then
  # shellcheck source=scripts/env.sh
  . scripts/env.sh
  release_binary
  exit 0
fi
[ $# -eq 0 ] || die "unknown argument '$1' (only --print-binary)"

bash scripts/setup-dev.sh
# shellcheck source=scripts/env.sh
. scripts/env.sh

say "building the origin (cargo build --release -p fanout-origin)"
cargo build --release -p fanout-origin || die "origin build failed"
FANOUT_BIN="$(release_binary)"
[ -x "$FANOUT_BIN" ] || die "$FANOUT_BIN was not produced (cargo metadata's target directory)"

say "building the Worker"
bash scripts/build-worker.sh || die "worker build failed"

# --- secrets -----------------------------------------------------------------------------------
random_secret() { printf 'whsec_%s' "$(head -c 32 /dev/urandom | base64 | tr -d '\n')"; }

if [ ! -f .dev.vars ]; then
  say "creating .dev.vars with a fresh EDGE_SIGNING_KEY"
  (umask 077; printf 'EDGE_SIGNING_KEY=%s\nALLOW_LOOPBACK_HTTP=true\n' "$(random_secret)" > .dev.vars)
fi
EDGE_KEY="$(sed -n 's/^EDGE_SIGNING_KEY=//p' .dev.vars | tail -n 1 | tr -d '"'"'"' \r')"
[ -n "$EDGE_KEY" ] || die ".dev.vars has no EDGE_SIGNING_KEY line; add one or delete .dev.vars"
grep -q '^ALLOW_LOOPBACK_HTTP=true' .dev.vars \
  || say "warning: .dev.vars does not set ALLOW_LOOPBACK_HTTP=true; http://127.0.0.1 subscribers will be refused"

token_file=".wrangler/fanout-dev-api-token"
token_from="\$FANOUT_API_TOKEN"
if [ -z "${FANOUT_API_TOKEN:-}" ]; then
  token_from="$token_file"
  if [ ! -s "$token_file" ]; then
    mkdir -p .wrangler
    (umask 077; head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$token_file")
  fi
  FANOUT_API_TOKEN="$(cat "$token_file")"
fi

# --- processes ---------------------------------------------------------------------------------
edge_pid=""
origin_pid=""
stopping=0

stop_group() { # pid: the leader of its own process group (set -m below)
  local pid="$1"
  [ -n "$pid" ] || return 0
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 1 50); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -KILL -- "-$pid" 2>/dev/null || true
}

cleanup() {
  [ "$stopping" = 1 ] && return
  stopping=1
  # Finish stopping even if the terminal/pipe is gone or Ctrl-C is pressed again.
  trap '' PIPE INT TERM
  say "stopping" 2>/dev/null || true
  stop_group "$origin_pid"
  stop_group "$edge_pid"
  wait 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Each service runs in its own process group (job control, `set -m`: portable where `setsid` is
# not) so stopping it also ends its children (wrangler's workerd); Ctrl-C reaches this script
# alone, whose trap stops both. Output is prefixed so the two streams can be told apart.
prefix() { # label: each line of stdin, prefixed, as it comes
  local line
  while IFS= read -r line || [ -n "$line" ]; do printf '%s %s\n' "$1" "$line"; done
}
set -m
npx wrangler dev --ip 127.0.0.1 --port "$EDGE_PORT" --persist-to .wrangler/state \
  --show-interactive-dev-session=false \
  > >(prefix '[edge]  ') 2>&1 < /dev/null &
edge_pid=$!

# The secrets go in the daemon's environment, which only its user can read, not in its
# arguments.
FANOUT_EDGE_KEY="$EDGE_KEY" FANOUT_API_TOKEN="$FANOUT_API_TOKEN" "$FANOUT_BIN" serve \
  --edge-url "http://127.0.0.1:$EDGE_PORT" \
  --allow-loopback \
  --db ./fanout.db \
  --listen "127.0.0.1:$ORIGIN_PORT" \
  > >(prefix '[origin]') 2>&1 < /dev/null &
origin_pid=$!
set +m

wait_healthy() { # name url pid
  local name="$1" url="$2" pid="$3" deadline=$((SECONDS + STARTUP_TIMEOUT_S))
  until curl -fsS -o /dev/null --max-time 2 "$url/healthz" 2>/dev/null; do
    kill -0 "$pid" 2>/dev/null || die "$name exited before answering $url/healthz (see its output above)"
    [ "$SECONDS" -lt "$deadline" ] || die "$name did not answer $url/healthz within ${STARTUP_TIMEOUT_S}s"
    sleep 0.2
  done
}
wait_healthy "edge (wrangler dev)" "http://127.0.0.1:$EDGE_PORT" "$edge_pid"
wait_healthy "origin (fanout serve)" "http://127.0.0.1:$ORIGIN_PORT" "$origin_pid"

cat <<EOF

  Fanout is running.
    origin API + admin console  http://127.0.0.1:$ORIGIN_PORT/
    edge (wrangler dev)         http://127.0.0.1:$EDGE_PORT/
    API token                   $FANOUT_API_TOKEN (from $token_from)
    ledger                      ./fanout.db
    fanout binary               $FANOUT_BIN

  e.g.  curl -H "Authorization: Bearer $FANOUT_API_TOKEN" http://127.0.0.1:$ORIGIN_PORT/v1/deliveries
  Receive webhooks in another terminal (docs/src/getting-started.md, "Trying it"):
        export FANOUT_API_TOKEN=...   # the API token above
        FANOUT_SERVER=http://127.0.0.1:$ORIGIN_PORT $FANOUT_BIN listen
  Ctrl-C stops both.

EOF

# Run until Ctrl-C or until either service exits (polled: bash 3.2 has no `wait -n`).
while kill -0 "$edge_pid" 2>/dev/null && kill -0 "$origin_pid" 2>/dev/null; do
  sleep 1
done
if [ "$stopping" = 0 ]; then
  status=0
  for pid in "$edge_pid" "$origin_pid"; do
    kill -0 "$pid" 2>/dev/null && continue
    set +e
    wait "$pid"
    status=$?
    set -e
  done
  say "a service exited (status $status); stopping the other"
  exit "$status"
fi
