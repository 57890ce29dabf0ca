# Start the peers bench (bench/device/peers.sh) in its own session, or, when ROOT already has one, only watch it;
# for up to SECONDS, then bring its table and records back in $OUT (peers.tgz: bench.log, peers.json, each side's
# side.json). The bench outlives a call (600 s at most): chain the next call at once, the machine goes back ~30 s
# after a call ends. Its first call must carry what peers.sh needs (the GGUF's last part and .whl; the docs'
# three-call recipe, docs/performance.md "On a GPU").
# Usage: bash bench/device/peers_start.sh ROOT SECONDS [STEPS [more peers_bench.py arguments]]
R=${1:-/tmp/pr}; mkdir -p "$R/logs"
if [ ! -f "$R/started" ]; then
  touch "$R/started"
  cp bench/device/peers.sh "$R/run.sh"   # bash reads a script as it runs: the next call may replace this copy
  echo "$(date +%T) started" >> "$R/steps"
  # shellcheck disable=SC2016  # expanded by the inner bash
  setsid nohup bash -c 'bash "$1/run.sh" "${@:2}" > "$1/logs/bench.log" 2>&1; rc=$?
    if [ $rc -eq 0 ]; then echo "$(date +%T) DONE" >> "$1/steps"; else echo "$(date +%T) FAILED $rc" >> "$1/steps"; fi' \
    _ "$R" "${@:3}" > "$R/driver.log" 2>&1 < /dev/null &
fi
source bench/device/watch.sh
watch_run "$R" "${2:-500}"
grep -A8 "^| side" "$R/logs/bench.log" 2>/dev/null
tar czf "${OUT:-/tmp}/peers.tgz" -C / "${R#/}/logs" "${R#/}/steps" $(cd / && ls tmp/peers/peers.json tmp/peers/*/side.json \
  2>/dev/null) 2>/dev/null; ls -la "${OUT:-/tmp}"
