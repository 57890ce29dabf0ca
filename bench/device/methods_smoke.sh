# The first call of a methods run on the device (docs/methods.md, "On the GPU"): carries the demo GGUF's first part
# to /tmp/stage for q_start.sh, checks the block drafters' FlexAttention against their dense mask (compiled, bf16,
# forward and gradients), and times each draft method's training step on a 5-layer store of the demo target's shape
# (16,384-token steps, compiled), so the quality run's recipe can be sized to the session. Logs in $OUT.
# Usage: bash bench/device/methods_smoke.sh [METHODS]
source bench/device/setup.sh
set +x
mkdir -p /tmp/stage && cp .dq2/gguf.part00 /tmp/stage/ && ls -la /tmp/stage
O=${OUT:-/tmp}
timeout 240 python3 bench/train_bench.py check > "$O/check.log" 2>&1; echo "check: exit $?"; grep check "$O/check.log"
python3 bench/train_bench.py make --root /tmp/tb --shape smollm2 --samples 64 --aux-layers 2,8,15,22,27 \
  --store-dtype float8_e4m3 > "$O/make.log" 2>&1; tail -1 "$O/make.log"
for m in ${1:-dflash dspark eagle3 eagle3.1}; do
  timeout 150 torchrun --nproc_per_node 1 bench/train_bench.py run --root /tmp/tb --shape smollm2 --method "$m" \
    --modes memory --steps 10 --warmup 3 --compile --out "$O/tb-$m.json" > "$O/tb-$m.log" 2>&1
  echo "$m: exit $?"; grep -E '"step_s_median"|Error' "$O/tb-$m.log" | tail -2 | cut -c1-400
done
