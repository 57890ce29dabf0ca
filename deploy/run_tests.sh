#!/usr/bin/env bash
# Runs the whole suite (unit, integration, end-to-end). pytest exits 5 when it collected nothing:
# that is a failure here, never a silent pass.
#
# SIGTERM, SIGINT or SIGHUP to this script (a CI timeout, an operator, make) is passed on to pytest as SIGTERM,
# and the script waits for it: pytest then tears its fixtures down (servers stop) and tests/conftest.py checks
# that no process of the project is left. Without this, bash would die at once and leave pytest running.
set -uo pipefail
cd "$(dirname "$0")/.."
bash deploy/test_deps.sh || exit 1
.venv/bin/python -m pytest "$@" &
pid=$!
forward() { kill -TERM "$pid" 2>/dev/null || true; }
trap forward TERM INT HUP
wait "$pid"
rc=$?
while kill -0 "$pid" 2>/dev/null; do  # `wait` returns early when a trapped signal arrives
  wait "$pid"
  rc=$?
done
if [ "$rc" -eq 5 ]; then
  echo "run_tests: pytest collected no tests; treating as failure" >&2
  exit 1
fi
exit "$rc"
