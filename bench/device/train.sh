# Trainer loader on one H200: FP8 store read from disk (page cache dropped each step) vs in memory, 8B-shaped draft.
source "$(dirname "$0")/setup.sh"
OUTDIR=${1:-/tmp/out}; mkdir -p "$OUTDIR"
for dt in ${STORE_DTYPES:-float8_e4m3}; do
  rm -rf /tmp/b-$dt
  python3 bench/train_bench.py make --root /tmp/b-$dt --samples 128 --store-dtype $dt 2>&1 | tee -a "$OUTDIR/train_$dt.jsonl"
  torchrun --nproc_per_node 1 bench/train_bench.py run --root /tmp/b-$dt --steps 10 --warmup 3 ${COMPILE---compile} \
    2>&1 | grep -E '^\{' | tee -a "$OUTDIR/train_$dt.jsonl"
done
