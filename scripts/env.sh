# shellcheck shell=bash
# Environment shared by Fanout's scripts. Source it; it only sets variables for the calling shell:
#   . scripts/env.sh
# Nothing here touches the network or installs anything (that is scripts/setup.sh).

FANOUT_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export FANOUT_ROOT

# Tools installed by `cargo install` (worker-build, wasm-bindgen) live here.
FANOUT_CARGO_BIN="${CARGO_HOME:-$HOME/.cargo}/bin"
case ":$PATH:" in
  *":$FANOUT_CARGO_BIN:"*) ;;
  *) PATH="$FANOUT_CARGO_BIN:$PATH" ;;
esac
export PATH

# worker-build would otherwise try to download its own wasm-bindgen CLI (unreachable here).
# scripts/setup.sh installs the CLI at exactly the version Cargo.lock pins.
export WASM_BINDGEN_BIN="${WASM_BINDGEN_BIN:-$FANOUT_CARGO_BIN/wasm-bindgen}"

# Keep wrangler off the network: no telemetry, no request.cf lookup.
export WRANGLER_SEND_METRICS=false
export CLOUDFLARE_CF_FETCH_ENABLED=false
