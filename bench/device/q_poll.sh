# Watch a quality run (bench/device/quality.sh) for up to SECONDS, then bring its records back in $OUT/q.tgz, and
# its data (prompts, prepared, synthesized; for quality.sh's CORPUS next time) in $OUT/corpus.tgz.00, .01, ... once it is built.
# Usage: bash bench/device/q_poll.sh ROOT SECONDS
R=${1:-/tmp/q}; end=$(( $(date +%s) + ${2:-500} ))
while [ "$(date +%s)" -lt $end ] && ! grep -q -E "DONE|FAILED" "$R/steps" 2>/dev/null; do
  sleep 20
  echo "--- $(date +%T) $(tail -1 "$R/steps" 2>/dev/null)"
  for f in "$R"/logs/*.log; do [ -f "$f" ] && echo "$(basename "$f"): $(grep -v '^Loading' "$f" | tail -1 | cut -c1-160)"; done
  nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
done
cat "$R/steps"; tail -5 "$R/driver.log"
cd "$R" && tar czf "${OUT:-/tmp}/q.tgz" steps driver.log logs $(ls -d */run/eval */run/train*/metrics.jsonl */run/prompts/summary.json \
  */run/synthesized/summary.json */run/run.json */run/convert.json 2>/dev/null) 2>/dev/null; ls -la "${OUT:-/tmp}"
if grep -q "^[0-9]* data" "$R/steps" 2>/dev/null; then  # in 15 MiB parts: a file over 16 MiB does not come back
  tar czf - -C "$R" bf16/run/prompts bf16/run/prepared bf16/run/synthesized | split -b 15m -d - "${OUT:-/tmp}/corpus.tgz."
  ls -la "${OUT:-/tmp}"/corpus.tgz.*
fi
