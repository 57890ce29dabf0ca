# Extraction bench on one H200, FP8 then bf16 store (docs/performance.md). Usage: bash bench/device/extract.sh OUTDIR
# Env: SAMPLES (512) in SHARDS (1): a shard of 512 samples (~0.8M tokens, ~4 s of forward) measures the steady
# state; small shards (e.g. SAMPLES=128 SHARDS=4: 32 samples, 0.3 s each) measure the per-shard fill and drain too
# (the pipeline's default shard is data.shard_size = 2,000 samples). WRITERS (8), STORE_DTYPES, EXTRA (more flags).
source "$(dirname "$0")/setup.sh"
OUTDIR=${1:-/tmp/out}; mkdir -p "$OUTDIR"
[ -d /tmp/llama1b ] || python3 - <<'PY'
import torch
from transformers import LlamaConfig, LlamaForCausalLM
cfg = LlamaConfig(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                  num_key_value_heads=8, vocab_size=32000, tie_word_embeddings=False)
with torch.device("cuda"):
    m = LlamaForCausalLM(cfg).to(torch.bfloat16)
m.save_pretrained("/tmp/llama1b")
PY
for dt in ${STORE_DTYPES:-float8_e4m3 bfloat16}; do
  python3 bench/extract_bench.py --model /tmp/llama1b --device cuda --seq-len 2048 --batch-tokens 16384 \
    --work-dir data/runs/bench --samples ${SAMPLES:-512} --shards ${SHARDS:-1} --writer-threads ${WRITERS:-8} --repeats 2 --write-mb 3072 \
    --store-dtype $dt ${EXTRA:-} 2>&1 | grep -v "Loading weights" | tee "$OUTDIR/extract_$dt.md"
done
