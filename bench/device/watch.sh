# Sourced by the device scripts that run a bench in its own session and watch it (q_poll.sh, long_start.sh,
# peers_start.sh).
#
# `start_once ROOT SCRIPT ARGS...`: the first call runs a copy of SCRIPT (ROOT/run.sh: bash reads a script as it
# runs, and the next call may replace the repository's) with ARGS in a session of its own, so it outlives the
# device call; its output goes to ROOT/driver.log, and a last line "exited RC" to ROOT/steps when it ends, however
# it ends. A later call finds ROOT/started and starts nothing.
start_once() {
  local root=$1 script=$2; shift 2
  mkdir -p "$root"; [ -f "$root/started" ] && return 0
  touch "$root/started"; cp "$script" "$root/run.sh"
  # shellcheck disable=SC2016  # expanded by the inner bash
  setsid nohup bash -c 'r=$1; shift; bash "$r/run.sh" "$@"; rc=$?; echo "$(date +%s) exited $rc" >> "$r/steps"' \
    _ "$root" "$@" > "$root/driver.log" 2>&1 < /dev/null &
}

# `watch_run ROOT SECONDS` prints, every 20 s until ROOT/steps says DONE, FAILED or exited, or SECONDS pass, the
# last step, each log's last line and the GPU's use; then every step and the driver's last lines.
watch_run() {
  local root=$1 end=$(( $(date +%s) + ${2:-500} )) f
  while [ "$(date +%s)" -lt $end ] && ! grep -q -E "DONE|FAILED|exited" "$root/steps" 2>/dev/null; do
    sleep 20
    echo "--- $(date +%T) $(tail -1 "$root/steps" 2>/dev/null | cut -c1-200)"
    for f in "$root"/logs/*.log; do [ -f "$f" ] && echo "$(basename "$f"): $(grep -v '^Loading' "$f" | tail -1 | cut -c1-160)"; done
    nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
  done
  cat "$root/steps"; tail -5 "$root/driver.log"
}
