# Start the long-context run (bench/device/long_context.sh) in its own session, or, when ROOT already has one, only
# watch it; for up to SECONDS, then bring its records back in $OUT (lc.tgz: steps, logs, the split, the
# evaluations, report.md). Chain calls at once: the machine goes back ~30 s after a call ends.
# Usage: bash bench/device/long_start.sh ROOT SECONDS
R=${1:-/tmp/lc}; mkdir -p "$R"
if [ ! -f "$R/started" ]; then
  touch "$R/started"
  cp bench/device/long_context.sh "$R/run.sh"   # bash reads a script as it runs: the next call may replace this copy
  setsid nohup bash "$R/run.sh" "$R" > "$R/driver.log" 2>&1 < /dev/null &
fi
end=$(( $(date +%s) + ${2:-500} ))
while [ "$(date +%s)" -lt $end ] && ! grep -q -E "DONE|FAILED" "$R/steps" 2>/dev/null; do
  sleep 20
  echo "--- $(date +%T) $(tail -1 "$R/steps" 2>/dev/null | cut -c1-200)"
  for f in "$R"/logs/*.log; do [ -f "$f" ] && echo "$(basename "$f"): $(grep -v '^Loading' "$f" | tail -1 | cut -c1-160)"; done
  nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
done
cat "$R/steps"; tail -5 "$R/driver.log"; cat "$R/report.md" 2>/dev/null
cd "$R" && tar czf "${OUT:-/tmp}/lc.tgz" steps driver.log logs $(ls long-split.json report.md */run/eval \
  */run/train/metrics.jsonl */run/synthesized/summary.json 2>/dev/null) 2>/dev/null; ls -la "${OUT:-/tmp}"
