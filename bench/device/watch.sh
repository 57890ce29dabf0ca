# Sourced by the device scripts that watch a run in its own session (q_poll.sh, long_start.sh): `watch_run ROOT
# SECONDS` prints, every 20 s until ROOT/steps says DONE or FAILED or SECONDS pass, the last step, each log's last
# line and the GPU's use; then every step and the driver's last lines.
watch_run() {
  local root=$1 end=$(( $(date +%s) + ${2:-500} )) f
  while [ "$(date +%s)" -lt $end ] && ! grep -q -E "DONE|FAILED" "$root/steps" 2>/dev/null; do
    sleep 20
    echo "--- $(date +%T) $(tail -1 "$root/steps" 2>/dev/null | cut -c1-200)"
    for f in "$root"/logs/*.log; do [ -f "$f" ] && echo "$(basename "$f"): $(grep -v '^Loading' "$f" | tail -1 | cut -c1-160)"; done
    nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
  done
  cat "$root/steps"; tail -5 "$root/driver.log"
}
