# The quality run on one H200 (issues #18, #19; docs/performance.md "Quality run"): the varied corpus built by
# the pipeline's own stages (configs/varied-corpus.yaml through bench/quality_run.py), then drafts trained on the
# same data: bf16 store, FP8 store, and one variant per training choice, each evaluated on the config's sets.
# Usage: bash bench/device/quality.sh ROOT   (logs in ROOT/logs, a line per finished step in ROOT/steps)
# Env: SELF_INSTRUCT (3000), EPOCHS (10), SYNTH_BATCH (1024), FP8 (1: also the FP8-store draft), VARIANTS (below)
# A CPU rehearsal: NO_WHEELS=1 PY=.venv/bin/python QEXTRA='--tiny --set ...' bash bench/device/quality.sh /tmp/qr
# The device tool ends a call's processes when it returns; q_start.sh runs this under setsid so that it goes on
# between calls, and q_poll.sh watches it.
source bench/device/setup.sh   # run from the repository root (q_start.sh runs a copy of this file)
set +x
R=${1:-/tmp/q}; L=$R/logs; mkdir -p "$L"
export PYTHONPATH=$PYTHONPATH:$PWD/bench TORCHINDUCTOR_CACHE_DIR=/tmp/inductor
Q="${PY:-python3} bench/quality_run.py --config configs/varied-corpus.yaml --data-dir /tmp/qdata"
DATA="--set prompts.self_instruct=${SELF_INSTRUCT:-3000} --set synthesize.samples_per_prompt=2 --set synthesize.user_turns=0
 --set synthesize.batch_size=${SYNTH_BATCH:-1024} --set data.shard_size=1000"
TRAIN="--set train.max_steps=null --set train.epochs=${EPOCHS:-10} --set train.batch_tokens=16384 --set train.lr=1e-3
 --set train.warmup_steps=50 --set train.min_lr_ratio=0.1 --set train.ttt_steps=7 --set train.draft_vocab_size=32000
 --set train.checkpoint_every=50 --set train.keep_checkpoints=2 --set train.log_every=20
 --set evaluate.offline_dtype=float32 ${QEXTRA:-}"
step() { echo "$(date +%s) $*" >> "$R/steps"; }
step start
$Q --root $R/bf16 $DATA $TRAIN --until convert > $L/bf16-data.log 2>&1 || { step FAILED bf16-data; exit 1; }
step data
# the bf16 and FP8 drafts train at once (same data, same seed); the FP8 store is extracted while bf16 trains
FP8_STORE="--reuse-data $R/bf16 --set extract.store_dtype=float8_e4m3"
DRAFTS="bf16"; [ "${FP8:-1}" = 1 ] && DRAFTS="bf16 fp8"
$Q --root $R/bf16 $DATA $TRAIN --set train.keep_checkpoints=100 --until train > $L/bf16-train.log 2>&1 & a=$!
b=""; [ "${FP8:-1}" = 1 ] && { $Q --root $R/fp8 $DATA $TRAIN $FP8_STORE --until train > $L/fp8-train.log 2>&1 & b=$!; }
wait $a || step FAILED bf16-train; [ -z "$b" ] || wait $b || step FAILED fp8-train
step trained $DRAFTS
# evaluation (launch-bound, one process per set) beside the training-choice variants (GPU-bound)
for v in $DRAFTS; do
  extra=""; [ $v = fp8 ] && extra=$FP8_STORE
  for s in varied humaneval template-held-out; do
    $Q --root $R/$v $DATA $TRAIN $extra --eval-only $s > $L/$v-eval-$s.log 2>&1 &
  done
done
# training choices: another seed (the noise floor), a quarter and half of the data (nested hash-chosen subsets,
# the same epochs), TTT length and learning rate train on the bf16 store itself (run/train-NAME); the draft
# vocabulary changes the convert stage, so it gets a store of its own. VARIANTS picks them, in this order.
declare -A VARIANT=([seed1]="--set train.seed=1" [frac25]="--set train.data_fraction=0.25"
                    [frac50]="--set train.data_fraction=0.5" [ttt3]="--set train.ttt_steps=3"
                    [lr3e-4]="--set train.lr=3e-4" [vocab8k]="--set train.draft_vocab_size=8192 --reuse-data $R/bf16")
variant() {  # NAME: the arguments that train and evaluate it
  if [ "$1" = vocab8k ]; then echo "--root $R/vocab8k ${VARIANT[$1]}"; else echo "--root $R/bf16 ${VARIANT[$1]} --train-name $1"; fi
}
pids=()
for v in ${VARIANTS-seed1 frac25 frac50 ttt3 lr3e-4 vocab8k}; do
  $Q $DATA $TRAIN $(variant $v) --until train > $L/$v-train.log 2>&1 & pids+=($!)
done
for p in "${pids[@]}"; do wait $p; done
step trained variants
K3="--set evaluate.compare_steps=[3]"
for s in varied humaneval; do
  for v in ${VARIANTS-seed1 frac25 frac50 ttt3 lr3e-4 vocab8k}; do
    $Q $DATA $TRAIN $(variant $v) $K3 --eval-only $s > $L/$v-eval-$s.log 2>&1 &
  done
done
# the epoch curve: earlier checkpoints of the bf16 draft on the varied set
last=$(${PY:-python3} -c "import json;print(json.load(open('$R/bf16/run/train/checkpoints/latest.json'))['step'])")
for s in $(for f in 1 2 3 5 7; do echo $(( (last * f / 10 + 25) / 50 * 50 )); done | sort -un); do
  [ $s -ge 50 ] && [ $s -lt $last ] || continue
  $Q --root $R/bf16 $DATA $TRAIN $K3 --eval-only varied --checkpoint $s > $L/bf16-eval-varied-step$s.log 2>&1 &
done
wait
step DONE
