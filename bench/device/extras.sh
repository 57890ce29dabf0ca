# Alongside a quality run (q_start.sh starts it when EXTRAS=1): once the base draft is trained (the evaluation that
# follows is launch-bound at batch 1, the GPU mostly idle), issue #33's two equality checks on the same machine:
# the fused soft cross-entropy against the eager one over 200 steps of the SmolLM2-shaped bench (item 1's loss
# curve; each with fresh inductor and Triton caches, so the first run's log also holds the bench's cold compile),
# and our decode loop against the old generation on the demo model's real weights, greedy, first 64 prompts
# (item 3). Logs in ROOT/logs/extras-*.log, which q_poll.sh brings back.  Usage: bash bench/device/extras.sh ROOT
R=${1:-/tmp/q}; L=$R/logs; B=${BASE:-bf16}; mkdir -p "$L"
until grep -q -E "trained $B|FAILED" "$R/steps" 2>/dev/null; do sleep 10; done
NO_WHEELS=1 source bench/device/setup.sh   # quality.sh installed them
set +x
M=/tmp/qdata/models/SmolLM2-135M-Instruct
python3 bench/train_bench.py make --root /tmp/b --samples 128 --shape smollm2 > $L/extras-make.log 2>&1
for mode in fused eager; do
  flag=""; [ $mode = eager ] && flag=--eager-loss
  TORCHINDUCTOR_CACHE_DIR=/tmp/ind-$mode TRITON_CACHE_DIR=/tmp/tri-$mode torchrun --nproc_per_node 1 \
    bench/train_bench.py run --root /tmp/b --shape smollm2 --steps 200 --warmup 3 --modes memory --compile $flag \
    --out $L/extras-loss-$mode.json > $L/extras-loss-$mode.log 2>&1
done
python3 bench/generate_bench.py --model $M --batch 64 --max-new-tokens 128 --impl loop --check 64 > $L/extras-generate.log 2>&1
echo done >> $L/extras-done.log
