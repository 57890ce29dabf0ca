#!/usr/bin/env bash
# Runs the whole suite (unit, integration, end-to-end, UI) on both cores: three pytest processes side by side,
#   library: tests/integration tests/unit   (the demo model, SGLang on CPU, torchrun)
#   prefect: tests/e2e tests/ui             (Prefect servers, the `make serve` node, Chromium)
#   waiting: end-to-end files that mostly wait or balance the others, and library files that fill the waits (below)
# split so that they end about together, ~19-20 minutes on two cores (docs/testing.md). Not pytest-xdist's
# workers: a worker that ran a browser test keeps Playwright's event loop in its main thread and its served node's
# PREFECT_API_URL, and an end-to-end test after it on the same worker talks to the wrong server (docs/testing.md).
# Extra arguments go to both processes; PYTEST_SPLIT=0 runs everything in one process. Each process prints its
# 25 slowest tests and its time per directory and marker (tests/timing.py, which also applies the budget); the
# logs are in test-output/pytest-<name>.log and printed whole at the end.
#
# pytest exits 5 when it collected nothing: that is a failure here, never a silent pass.
#
# SIGTERM, SIGINT or SIGHUP to this script (a CI timeout, an operator, make) is passed on to pytest as SIGTERM,
# and the script waits for it: pytest then tears its fixtures down (servers stop) and tests/conftest.py checks
# that no process of the project is left. Without this, bash would die at once and leave pytest running.
set -uo pipefail
cd "$(dirname "$0")/.."
bash deploy/test_deps.sh || exit 1
mkdir -p test-output
start=$(date +%s)
# OpenMP threads that finish a parallel region spin for a while before they sleep (GNU OpenMP's default). With two
# pytest processes, SGLang servers and flow processes on two cores, those spinning threads took the cores from the
# process with work to do: the same two test files side by side ran 1.8x faster with PASSIVE (docs/testing.md).
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
# How busy the cores were over the run (from /proc/stat): near 100% means more processes would not help;
# well below it, they would. A line every 30 s in test-output/cpu.log shows where the cores sat idle.
cpu_ticks() { awk '/^cpu /{print $2+$3+$4+$5+$6+$7+$8+$9, $5+$6}' /proc/stat 2>/dev/null; }
cpu0=$(cpu_ticks)
( prev=$cpu0; while sleep 30 && kill -0 $$ 2>/dev/null; do now=$(cpu_ticks); echo "$(date +%T) $prev $now" | awk '{t=$4-$2; i=$5-$3;
  if (t > 0) printf "%s %3.0f%% busy\n", $1, 100 * (t - i) / t}'; prev=$now; done ) > test-output/cpu.log 2>/dev/null &
sampler=$!
if [ "${PYTEST_SPLIT:-1}" = 0 ]; then
  names=(all); groups=("tests")
else
  # The third process holds the end-to-end tests that mostly wait (a schedule's ticks, heartbeats running out,
  # their own Prefect servers): ~4.7 minutes of wall, little CPU, which in the prefect process kept it waiting
  # while the cores idled (81% busy). Self-contained CPU-bound library files fill its waits, so the three processes
  # end together (docs/testing.md, sessions 19 and 21): test_generation, test_retrain with the golden curve (they
  # share the demo store, a session fixture: one build per process), the SGLang architectures (~6 minutes) and, since
  # session 24 (the train walk's evaluation at a CPU's size, 2 minutes instead of 10), the block drafters.
  waiting="tests/e2e/test_schedule.py tests/e2e/test_crash_any_server.py tests/e2e/test_project_server.py"
  filling="tests/integration/test_generation.py tests/integration/test_retrain.py tests/integration/test_golden_curve.py"
  filling+=" tests/integration/test_architectures_sglang.py tests/integration/test_block_drafters.py"
  names=(library prefect waiting)
  groups=("tests/integration tests/unit $(printf -- '--ignore=%s ' $filling)"
          "tests/e2e tests/ui $(printf -- '--ignore=%s ' $waiting)"
          "$waiting $filling")
fi
pids=()
for i in "${!names[@]}"; do
  # shellcheck disable=SC2086  # a group is a list of directories
  .venv/bin/python -m pytest --durations=25 --junitxml="test-output/junit-${names[$i]}.xml" ${groups[$i]} "$@" \
    > "test-output/pytest-${names[$i]}.log" 2>&1 &
  pids+=($!)
done
forward() { for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; }
trap forward TERM INT HUP
rc=0
for i in "${!pids[@]}"; do
  code=0
  wait "${pids[$i]}" || code=$?
  while kill -0 "${pids[$i]}" 2>/dev/null; do  # `wait` returns early when a trapped signal arrives
    code=0
    wait "${pids[$i]}" || code=$?
  done
  cat "test-output/pytest-${names[$i]}.log"
  if [ "$code" -eq 5 ]; then
    echo "run_tests: pytest (${names[$i]}) collected no tests; treating as failure" >&2
    code=1
  fi
  [ "$code" -ne 0 ] && rc=1
  echo "run_tests: ${names[$i]} (${groups[$i]}) exit $code" >&2
done
passed=0; failed=0
for n in "${names[@]}"; do
  line="$(grep -E '^(=+ )?[0-9]+ (passed|failed|errors?|skipped|deselected)\b.* in [0-9.]+s' "test-output/pytest-$n.log" | tail -1)"
  p="$(grep -oE '[0-9]+ passed' <<<"$line" | grep -oE '[0-9]+' || true)"
  passed=$((passed + ${p:-0}))
  for f in $(grep -oE '[0-9]+ (failed|errors?)' <<<"$line" | grep -oE '^[0-9]+' || true); do failed=$((failed + f)); done
done
kill "$sampler" 2>/dev/null
busy=$(echo "$cpu0 $(cpu_ticks)" | awk '{t=$3-$1; i=$4-$2; if (t > 0) printf "%.0f", 100 * (t - i) / t}')
echo "run_tests: pytest took $(( $(date +%s) - start )) s in ${#names[@]} process(es), exit $rc;" \
  "the cores were ${busy:-?}% busy on average (test-output/cpu.log; every test's time: test-output/junit-*.xml)" >&2
[ "$rc" -ne 0 ] && [ "$failed" -eq 0 ] && failed=1  # a failure pytest did not count (a crash, a leftover process)
echo "run_tests: $passed passed, $failed failed"
exit "$rc"
