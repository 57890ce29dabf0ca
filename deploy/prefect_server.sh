#!/usr/bin/env bash
# Start, stop or check a real local Prefect server: SQLite under a project-local PREFECT_HOME
# (default <repo>/.prefect), log in $PREFECT_HOME/server.log, pid in $PREFECT_HOME/server.pid.
#
#   bash deploy/prefect_server.sh start    # idempotent: returns at once if ours is already healthy
#   bash deploy/prefect_server.sh status   # exit 0 when healthy
#   bash deploy/prefect_server.sh stop
#
# Environment: PREFECT_HOME, PREFECT_SERVER_HOST (127.0.0.1), PREFECT_SERVER_PORT (4200),
# PREFECT_BIN (<repo>/.venv/bin/prefect), PREFECT_SERVER_START_TIMEOUT (120 s), EAGLE3_STARTED_BY (what started
# it, said again by `stop`: `make demo`, `make serve`, ...), EAGLE3_CRASH_AFTER_S (150: silence after which the
# crash-zombie-runs automation, registered on every server started here, marks a flow run Crashed).
#
# The project's own server (PREFECT_HOME = <repo>/.prefect) also becomes the active project profile `eagle3`
# in .prefect/profiles.toml (deploy/project_profile.py): prefect.toml points Prefect there, so `prefect ...`
# and `eagle3 ...` run in the project directory reach this server from any shell, whatever its port.
set -euo pipefail
cd "$(dirname "$0")/.."

export PREFECT_HOME="${PREFECT_HOME:-$PWD/.prefect}"
HOST="${PREFECT_SERVER_HOST:-127.0.0.1}"
PORT="${PREFECT_SERVER_PORT:-4200}"
PREFECT_BIN="${PREFECT_BIN:-$PWD/.venv/bin/prefect}"
TIMEOUT="${PREFECT_SERVER_START_TIMEOUT:-120}"
PID_FILE="$PREFECT_HOME/server.pid"
BY_FILE="$PREFECT_HOME/server.started-by"
LOG_FILE="$PREFECT_HOME/server.log"
HEALTH="http://$HOST:$PORT/api/health"
# What clients on this machine use (a server listening on 0.0.0.0 is reached at 127.0.0.1).
API_URL="http://$([ "$HOST" = 0.0.0.0 ] && echo 127.0.0.1 || echo "$HOST"):$PORT/api"

healthy() { curl -fsS --max-time 2 "$HEALTH" >/dev/null 2>&1; }
our_pid() { [ -f "$PID_FILE" ] && kill -0 "$(cat "$PID_FILE")" 2>/dev/null && cat "$PID_FILE"; }
started_by() { cat "$BY_FILE" 2>/dev/null || echo "deploy/prefect_server.sh start"; }

# Every server started here marks runs whose process died Crashed (their heartbeats stop; prefect.toml makes every
# flow run of the project beat every 30 s), `make demo`'s as well as `make serve`'s. Not fatal: a server without
# it still serves; the message says how to add it.
crash_automation() {
  PREFECT_API_URL="$API_URL" "$(dirname "$PREFECT_BIN")/python" deploy/deployments.py crash-automation \
    ${EAGLE3_CRASH_AFTER_S:+--crash-after-s "$EAGLE3_CRASH_AFTER_S"} ||
    echo "prefect_server: crash automation not registered; run: python deploy/deployments.py crash-automation" >&2
}

# The project's own server is what the project's commands reach (prefect.toml -> .prefect/profiles.toml).
point_project_profile() {
  [ "$(realpath -m "$PREFECT_HOME")" = "$(realpath -m "$PWD/.prefect")" ] || return 0
  "$(dirname "$PREFECT_BIN")/python" deploy/project_profile.py "$API_URL"
}

start() {
  if pid=$(our_pid) && healthy; then
    echo "prefect server already running (pid $pid, started by $(started_by)): http://$HOST:$PORT"
    point_project_profile
    return 0
  fi
  if healthy; then
    echo "prefect_server: something else already answers on $HOST:$PORT (not started by this script);" \
      "stop it or set PREFECT_SERVER_PORT" >&2
    return 1
  fi
  mkdir -p "$PREFECT_HOME"
  echo "${EAGLE3_STARTED_BY:-deploy/prefect_server.sh start}" >"$BY_FILE"
  # Heartbeat-based services and the scheduler are not needed for local runs. PREFECT_API_URL: the server's
  # own address (its UI calls it unless PREFECT_UI_API_URL says otherwise), never a profile's.
  PREFECT_API_URL="$API_URL" \
    PREFECT_SERVER_ANALYTICS_ENABLED=false \
    PREFECT_SERVER_SERVICES_LATE_RUNS_ENABLED=false \
    nohup setsid "$PREFECT_BIN" server start --host "$HOST" --port "$PORT" >>"$LOG_FILE" 2>&1 </dev/null &
  echo $! >"$PID_FILE"
  local waited=0
  until healthy; do
    if ! kill -0 "$(cat "$PID_FILE")" 2>/dev/null; then
      echo "prefect_server: server exited during start-up; last lines of $LOG_FILE:" >&2
      tail -20 "$LOG_FILE" >&2
      rm -f "$PID_FILE"
      return 1
    fi
    if [ "$waited" -ge "$TIMEOUT" ]; then
      echo "prefect_server: not healthy after ${TIMEOUT}s; see $LOG_FILE" >&2
      stop
      return 1
    fi
    sleep 1
    waited=$((waited + 1))
  done
  echo "prefect server started (pid $(cat "$PID_FILE"), ${waited}s): UI http://$HOST:$PORT  API http://$HOST:$PORT/api"
  echo "  PREFECT_HOME=$PREFECT_HOME  log: $LOG_FILE"
  crash_automation
  point_project_profile
}

stop() {
  if pid=$(our_pid); then
    # setsid made the server the leader of its own process group: end the group (uvicorn workers too).
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$pid" 2>/dev/null && kill -KILL -- "-$pid" 2>/dev/null || true
    echo "prefect server stopped (pid $pid, started by $(started_by))"
  else
    echo "prefect server not running (no live pid in $PID_FILE)"
  fi
  rm -f "$PID_FILE" "$BY_FILE"
}

status() {
  if healthy; then
    echo "prefect server healthy: http://$HOST:$PORT (pid $(our_pid || echo "not ours"))"
  else
    echo "prefect server not answering on http://$HOST:$PORT"
    return 1
  fi
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  restart) stop; start ;;
  *) echo "usage: $0 start|stop|status|restart" >&2; exit 2 ;;
esac
