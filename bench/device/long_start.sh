# Start the long-context run (bench/device/long_context.sh) in its own session, or, when ROOT already has one, only
# watch it; for up to SECONDS, then bring its records back in $OUT (lc.tgz: steps, logs, the split, the
# evaluations, report.md). Chain calls at once: the machine goes back ~30 s after a call ends.
# Usage: bash bench/device/long_start.sh ROOT SECONDS
R=${1:-/tmp/lc}
source bench/device/watch.sh
start_once "$R" bench/device/long_context.sh "$R"
watch_run "$R" "${2:-500}"; cat "$R/report.md" 2>/dev/null
cd "$R" && tar czf "${OUT:-/tmp}/lc.tgz" steps driver.log logs $(ls long-split.json report.md */run/eval \
  */run/train/metrics.jsonl */run/synthesized/summary.json 2>/dev/null) 2>/dev/null; ls -la "${OUT:-/tmp}"
