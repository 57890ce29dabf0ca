# Start the peers bench (bench/device/peers.sh) in its own session, or, when ROOT already has one, only watch it;
# for up to SECONDS, then bring its table and records back in $OUT (peers.tgz: the driver's log, the bench's log,
# peers.json, each side's side.json). The bench outlives a call (600 s at most): chain the next call at once, the
# machine goes back ~30 s after a call ends. Its first call must carry what peers.sh needs (the GGUF's last part and
# .whl; the docs' three-call recipe, docs/performance.md "On a GPU"). Its steps end with "exited 0" when it passed.
# Usage: bash bench/device/peers_start.sh ROOT SECONDS [STEPS [more peers_bench.py arguments]]
R=${1:-/tmp/pr}
source bench/device/watch.sh
start_once "$R" bench/device/peers.sh "${@:3}"
mkdir -p "$R/logs" && ln -sfn /tmp/peers/bench.log "$R/logs/bench.log"   # peers.sh tees the bench there
watch_run "$R" "${2:-500}"
grep -A8 "^| side" "$R/logs/bench.log" 2>/dev/null
tar czhf "${OUT:-/tmp}/peers.tgz" -C / "${R#/}/driver.log" "${R#/}/steps" $(cd / && ls tmp/peers/bench.log \
  tmp/peers/peers.json tmp/peers/*/side.json 2>/dev/null) 2>/dev/null; ls -la "${OUT:-/tmp}"
