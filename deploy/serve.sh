#!/usr/bin/env bash
# The node's Prefect side, up or down (`make serve` / `make stop`). Idempotent.
#
#   bash deploy/serve.sh start    # server (deploy/prefect_server.sh) + pool, limits, deployments, automations
#                                 # (deploy/deployments.py) + a worker for the pool; prints the UI URL
#   bash deploy/serve.sh worker   # only a worker, for another node: PREFECT_API_URL = the first node's API
#   bash deploy/serve.sh stop     # worker, then server (also one that `make demo` started: it says so)
#   bash deploy/serve.sh status
#
# Worker: log $PREFECT_HOME/worker.log, pid $PREFECT_HOME/worker.pid. Environment: what prefect_server.sh
# reads (PREFECT_HOME, PREFECT_SERVER_HOST, PREFECT_SERVER_PORT), PREFECT_API_URL (`worker` only; default:
# the local server),
# EAGLE3_POOL (eagle3-gpu), EAGLE3_WORKER_NAME (<host>-<pool>), EAGLE3_WORK_QUEUE (pull only this queue of the
# pool: one per node for the extract-fanout flow, docs/multinode.md; default: every queue), EAGLE3_GPUS (size of
# the `gpu` limit; default: nvidia-smi), EAGLE3_HEARTBEAT_S (30), EAGLE3_CRASH_AFTER_S (150).
set -euo pipefail
cd "$(dirname "$0")/.."

export PREFECT_HOME="${PREFECT_HOME:-$PWD/.prefect}"
HOST="${PREFECT_SERVER_HOST:-127.0.0.1}"
PORT="${PREFECT_SERVER_PORT:-4200}"
LOCAL_API="http://$([ "$HOST" = 0.0.0.0 ] && echo 127.0.0.1 || echo "$HOST"):$PORT/api"
export PREFECT_API_URL="${PREFECT_API_URL:-$LOCAL_API}"
BIN="${EAGLE3_BIN:-$PWD/.venv/bin}"
POOL="${EAGLE3_POOL:-eagle3-gpu}"
WORKER_NAME="${EAGLE3_WORKER_NAME:-$(hostname)-$POOL}"
HEARTBEAT_S="${EAGLE3_HEARTBEAT_S:-30}"
WORKER_PID="$PREFECT_HOME/worker.pid"
WORKER_LOG="$PREFECT_HOME/worker.log"

worker_pid() { [ -f "$WORKER_PID" ] && kill -0 "$(cat "$WORKER_PID")" 2>/dev/null && cat "$WORKER_PID"; }

start_worker() {
  if pid=$(worker_pid); then
    echo "worker already running (pid $pid, pool $POOL): log $WORKER_LOG"
    return 0
  fi
  mkdir -p "$PREFECT_HOME"
  # Flow runs inherit this environment: heartbeats for the crash automation (the pool's job template sets
  # the same for workers started elsewhere). setsid: `stop` ends the worker and its flow runs as one group.
  PREFECT_FLOWS_HEARTBEAT_FREQUENCY="$HEARTBEAT_S" \
    nohup setsid "$BIN/prefect" worker start --pool "$POOL" --type process --name "$WORKER_NAME" \
    ${EAGLE3_WORK_QUEUE:+--work-queue "$EAGLE3_WORK_QUEUE"} \
    >>"$WORKER_LOG" 2>&1 </dev/null &
  echo $! >"$WORKER_PID"
  for _ in $(seq 1 60); do
    grep -q "started!" "$WORKER_LOG" 2>/dev/null && break
    if ! kill -0 "$(cat "$WORKER_PID")" 2>/dev/null; then
      echo "serve: the worker exited during start-up; last lines of $WORKER_LOG:" >&2
      tail -20 "$WORKER_LOG" >&2
      rm -f "$WORKER_PID"
      return 1
    fi
    sleep 1
  done
  echo "worker started (pid $(cat "$WORKER_PID"), pool $POOL, name $WORKER_NAME): log $WORKER_LOG"
}

stop_worker() {
  if pid=$(worker_pid); then
    # The worker and the flow runs it started share its process group (setsid above). Prefect 3.9's worker
    # does not exit on SIGTERM/SIGINT while its loop runs (seen here), so: SIGTERM to the group, 5 s, SIGKILL.
    # A flow run killed here is marked Crashed by the crash-zombie-runs automation once the server runs again.
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 10); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -KILL -- "-$pid" 2>/dev/null || true
    echo "worker stopped (pid $pid)"
  else
    echo "worker not running (no live pid in $WORKER_PID)"
  fi
  rm -f "$WORKER_PID"
}

start() {
  # `start` serves this node: its clients talk to the server it starts, whatever PREFECT_API_URL said
  # (the Makefile exports a default for port 4200).
  export PREFECT_API_URL="$LOCAL_API"
  EAGLE3_STARTED_BY="${EAGLE3_STARTED_BY:-make serve}" bash deploy/prefect_server.sh start
  args=(apply --heartbeat-s "$HEARTBEAT_S")
  [ -n "${EAGLE3_GPUS:-}" ] && args+=(--gpus "$EAGLE3_GPUS")
  [ -n "${EAGLE3_CRASH_AFTER_S:-}" ] && args+=(--crash-after-s "$EAGLE3_CRASH_AFTER_S")
  "$BIN/python" deploy/deployments.py "${args[@]}"
  start_worker
  echo
  echo "Prefect UI: ${PREFECT_API_URL%/api}   (deployments: ${PREFECT_API_URL%/api}/deployments; stop: make stop)"
}

case "${1:-}" in
  start) start ;;
  worker) start_worker ;;
  stop)
    stop_worker
    by=$(cat "$PREFECT_HOME/server.started-by" 2>/dev/null || true)
    if [ -n "$by" ] && [ "$by" != "make serve" ] && bash deploy/prefect_server.sh status >/dev/null 2>&1; then
      echo "serve: the Prefect server was started by \`$by\`, not \`make serve\`; stopping it too (its runs stay" \
        "in $PREFECT_HOME; \`make serve\` or \`make demo\` starts it again)"
    fi
    bash deploy/prefect_server.sh stop
    ;;
  status)
    bash deploy/prefect_server.sh status || true
    if pid=$(worker_pid); then echo "worker running (pid $pid): log $WORKER_LOG"; else echo "worker not running"; fi
    ;;
  *) echo "usage: $0 start|worker|stop|status" >&2; exit 2 ;;
esac
