# shellcheck shell=bash
# `source deploy/env.sh` (once per shell): Prefect and `eagle3` reach this project's local server from ANY
# directory, as they already do without it inside the project directory (prefect.toml). It exports the project's
# Prefect home and its profiles file, whose active profile `eagle3` holds the address `make serve` /
# `make demo` started the server on (deploy/prefect_server.sh), and turns off Prefect's throw-away server.
# A PREFECT_API_URL already exported in this shell (e.g. another node's server) is left as it is.
_eagle3_project="$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")/.." && pwd)"
export PREFECT_HOME="$_eagle3_project/.prefect"
export PREFECT_PROFILES_PATH="$PREFECT_HOME/profiles.toml"
export PREFECT_SERVER_EPHEMERAL_ENABLED=false
if [ -n "${PREFECT_API_URL:-}" ]; then
  echo "eagle3: Prefect home $PREFECT_HOME; server PREFECT_API_URL=$PREFECT_API_URL (exported in this shell)"
elif [ -f "$PREFECT_PROFILES_PATH" ]; then
  echo "eagle3: Prefect home $PREFECT_HOME; server from its profile: $(grep -m1 PREFECT_API_URL "$PREFECT_PROFILES_PATH")"
else
  echo "eagle3: Prefect home $PREFECT_HOME; no local server has started yet: make serve (or make serve-prefect)"
fi
unset _eagle3_project
