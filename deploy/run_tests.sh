#!/usr/bin/env bash
# Runs the whole suite (unit, integration, end-to-end, UI). pytest exits 5 when it collected nothing:
# that is a failure here, never a silent pass.
#
# Both cores: PYTEST_WORKERS (default 2) pytest-xdist workers, each test file on one worker (--dist loadfile: a
# module's shared server or store stays with its tests); PYTEST_WORKERS=1 runs in one process. Every run prints
# the 25 slowest tests and the time per directory and marker (tests/timing.py, which also applies the budget).
#
# SIGTERM, SIGINT or SIGHUP to this script (a CI timeout, an operator, make) is passed on to pytest as SIGTERM,
# and the script waits for it: pytest then tears its fixtures down (servers stop) and tests/conftest.py checks
# that no process of the project is left. Without this, bash would die at once and leave pytest running.
set -uo pipefail
cd "$(dirname "$0")/.."
bash deploy/test_deps.sh || exit 1
workers="${PYTEST_WORKERS:-2}"
args=(--durations=25)
[ "$workers" -gt 1 ] && args+=(-n "$workers" --dist loadfile)
start=$(date +%s)
.venv/bin/python -m pytest "${args[@]}" "$@" &
pid=$!
forward() { kill -TERM "$pid" 2>/dev/null || true; }
trap forward TERM INT HUP
wait "$pid"
rc=$?
while kill -0 "$pid" 2>/dev/null; do  # `wait` returns early when a trapped signal arrives
  wait "$pid"
  rc=$?
done
echo "run_tests: pytest took $(( $(date +%s) - start )) s with $workers worker(s), exit $rc" >&2
if [ "$rc" -eq 5 ]; then
  echo "run_tests: pytest collected no tests; treating as failure" >&2
  exit 1
fi
exit "$rc"
