#!/usr/bin/env bash
# Starts everything for local development: the Worker under `wrangler dev` and the origin daemon
# pointed at it. Ctrl-C stops both.
#
#   bash scripts/dev.sh
#
# Edge on 127.0.0.1:${EDGE_PORT:-8787}, origin on 127.0.0.1:${ORIGIN_PORT:-8080}, ledger ./fanout.db.
# The edge key lives in .dev.vars (created on first run) and the API token in
# .wrangler/fanout-dev-api-token (or $FANOUT_API_TOKEN); both are reused on later runs.
set -euo pipefail
cd "$(dirname "$0")/.."

EDGE_PORT="${EDGE_PORT:-8787}"
ORIGIN_PORT="${ORIGIN_PORT:-8080}"
STARTUP_TIMEOUT_S="${STARTUP_TIMEOUT_S:-180}"

say() { printf 'dev: %s\n' "$*"; }
die() { printf 'dev: error: %s\n' "$*" >&2; exit 1; }

bash scripts/setup.sh
# shellcheck source=scripts/env.sh
. scripts/env.sh

say "building the origin (cargo build --release -p fanout-origin)"
cargo build --release -p fanout-origin || die "origin build failed"
[ -x target/release/fanout ] || die "target/release/fanout was not produced"

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
if [ -z "${FANOUT_API_TOKEN:-}" ]; then
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

stop_group() { # pid
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

# Each service runs in its own process group (setsid) so stopping it also ends its children
# (wrangler's workerd). Output is prefixed so the two streams can be told apart.
setsid npx wrangler dev --ip 127.0.0.1 --port "$EDGE_PORT" --persist-to .wrangler/state \
  --show-interactive-dev-session=false \
  > >(sed -u 's/^/[edge]   /') 2>&1 < /dev/null &
edge_pid=$!

setsid target/release/fanout serve \
  --edge-url "http://127.0.0.1:$EDGE_PORT" \
  --edge-key "$EDGE_KEY" \
  --api-token "$FANOUT_API_TOKEN" \
  --allow-loopback \
  --db ./fanout.db \
  --listen "127.0.0.1:$ORIGIN_PORT" \
  > >(sed -u 's/^/[origin] /') 2>&1 < /dev/null &
origin_pid=$!

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
    API token                   $FANOUT_API_TOKEN
    ledger                      ./fanout.db

  e.g.  curl -H "Authorization: Bearer $FANOUT_API_TOKEN" http://127.0.0.1:$ORIGIN_PORT/v1/deliveries
  Receive webhooks in another terminal (README, "Trying it"):
        FANOUT_SERVER=http://127.0.0.1:$ORIGIN_PORT FANOUT_API_TOKEN=$FANOUT_API_TOKEN target/release/fanout listen
  Ctrl-C stops both.

EOF

# Run until Ctrl-C or until either service exits.
set +e
wait -n "$edge_pid" "$origin_pid"
status=$?
set -e
if [ "$stopping" = 0 ]; then
  say "a service exited (status $status); stopping the other"
  exit "$status"
fi
