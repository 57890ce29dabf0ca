# The quality run on one H200 (issues #18, #19; docs/performance.md "Quality run"): the varied corpus built by
# the pipeline's own stages (configs/varied-corpus.yaml through bench/quality_run.py), then drafts trained on the
# same data: bf16 store, FP8 store, and one variant per training choice, each evaluated on the config's sets.
# Usage: bash bench/device/quality.sh ROOT   (logs in ROOT/logs, a line per finished step in ROOT/steps)
# Env: SELF_INSTRUCT (3000), EPOCHS (the config's: 10), SYNTH_BATCH (the pipeline's: 2,048 on a GPU), FP8 (1: also the FP8-store draft), VARIANTS (below),
#      CHOICE_FRACTION (1: the training-choice variants on that fraction of the data), CURVE (1: the epoch curve),
#      K5 (1: the bf16/FP8 drafts evaluated at k=5 too), GAP (1: bench/acceptance_gap.py on the bf16 draft),
#      BASE (bf16: the base draft's store and directory under ROOT; fp8: an FP8 store, half the disk, as run 8),
#      GAP_RUNS (the acceptance_gap runs on the base draft, TOKENS:K each, e.g. "256:3 256:5"; default: the config's),
#      CORPUS (PATH/corpus.tgz: the parts PATH/corpus.tgz.00, .01, ... that q_poll.sh brought back from an earlier
#      run with the same data settings: its prompts, prepared and synthesized data, which the stages then find
#      current and skip; ~5 minutes of the device's time)
# A CPU rehearsal (~1 minute; add CORPUS=/tmp/qc_out/corpus.tgz to a second one):
#   NO_WHEELS=1 PY=.venv/bin/python SELF_INSTRUCT=6 FP8=0 VARIANTS= CURVE=0 K5=0 QEXTRA='--tiny --set prompts.include=[]
#   --set prompts.max_new_tokens=24 --set synthesize.max_new_tokens=16 --set evaluate.max_new_tokens=4
#   --set train.heldout_fraction=0 --set train.select=last --set train.batch_tokens=512 --set train.max_steps=2
#   --set train.draft_vocab_size=256 --set evaluate.sets=[{"name":"varied","dataset":"data/eval_varied_prompts.jsonl","num_prompts":1}]'
#   bash bench/device/quality.sh /tmp/qc; OUT=/tmp/qc_out bash bench/device/q_poll.sh /tmp/qc 5
# The device tool ends a call's processes when it returns; q_start.sh runs this under setsid so that it goes on
# between calls, and q_poll.sh watches it.
source bench/device/setup.sh   # run from the repository root (q_start.sh runs a copy of this file)
set +x
R=${1:-/tmp/q}; L=$R/logs; mkdir -p "$L"
export PYTHONPATH=$PYTHONPATH:$PWD/bench TORCHINDUCTOR_CACHE_DIR=/tmp/inductor
Q="${PY:-python3} bench/quality_run.py --config configs/varied-corpus.yaml --data-dir /tmp/qdata"
BASE=${BASE:-bf16}; declare -A STORE_DTYPE=([bf16]=bfloat16 [fp8]=float8_e4m3)
DATA="--set extract.store_dtype=${STORE_DTYPE[$BASE]} --set prompts.self_instruct=${SELF_INSTRUCT:-3000} --set synthesize.samples_per_prompt=2 --set synthesize.user_turns=0
 ${SYNTH_BATCH:+--set synthesize.batch_size=$SYNTH_BATCH} --set data.shard_size=1000"
# the training recipe is the config's (epochs 10, 16,384-token steps, lr 1e-3 cosine to 0.1x, TTT 7, vocabulary
# 32,000); here only EPOCHS when given, and the checkpoint and log cadence of the epoch curve
TRAIN="${EPOCHS:+--set train.epochs=$EPOCHS} --set train.checkpoint_every=50 --set train.keep_checkpoints=2
 --set train.log_every=20 --set evaluate.offline_dtype=float32 ${QEXTRA:-}"
step() { echo "$(date +%s) $*" >> "$R/steps"; }
step start
if [ -n "${CORPUS:-}" ]; then mkdir -p "$R" && cat "$CORPUS".* | tar xzf - -C "$R" && step corpus "$CORPUS"; fi
$Q --root $R/$BASE $DATA $TRAIN --until convert > $L/$BASE-data.log 2>&1 || { step FAILED $BASE-data; exit 1; }
step data
# Every draft is a chain, train then evaluate, and all chains run at once: a small variant is evaluated while the
# large ones still train (evaluation is launch-bound at batch 1, training GPU-bound).
FP8_STORE="--reuse-data $R/$BASE --set extract.store_dtype=float8_e4m3"
K3="--set evaluate.compare_steps=[3]"
chain() {  # NAME TRAIN-ARGS EVAL-SETS EVAL-ARGS: train, then one evaluation process per set
  local name=$1 args=$2 sets=$3 eargs=$4
  $Q $DATA $TRAIN $args --until train > $L/$name-train.log 2>&1 || { step FAILED $name-train; return 1; }
  step trained $name
  for s in $sets; do $Q $DATA $TRAIN $args $eargs --eval-only $s > $L/$name-eval-$s.log 2>&1 & done
  if [ "$name" = "$BASE" ] && [ "${GAP:-1}" = 1 ]; then  # decoding vs training-time acceptance, set by set
    for g in ${GAP_RUNS:-default}; do
      gargs=""; [ "$g" = default ] || gargs="--max-new-tokens ${g%:*} --steps ${g#*:}"
      for s in $sets; do ${PY:-python3} bench/acceptance_gap.py --config configs/varied-corpus.yaml --data-dir /tmp/qdata \
        --run-dir $R/$BASE/run --checkpoint $R/$BASE/run/train --sets $s $gargs > $L/$BASE-gap-$s-${g/:/-k}.log 2>&1 & done
    done
  fi
  wait
  step evaluated $name
}
SETS="varied humaneval template-held-out"
BASE_K=""; [ "${K5:-1}" = 1 ] || BASE_K=$K3   # K5=0: the bf16/FP8 drafts at k=3 only (as the variants)
KEEP=""; [ "${CURVE:-1}" = 1 ] && KEEP="--set train.keep_checkpoints=100"  # the curve evaluates old checkpoints
chain $BASE "--root $R/$BASE $KEEP" "$SETS" "$BASE_K" & pids=($!)
[ "${FP8:-1}" = 1 ] && { chain fp8 "--root $R/fp8 $FP8_STORE" "$SETS" "$BASE_K" & pids+=($!); }
# training choices: another seed (the noise floor), a quarter and half of the data (nested hash-chosen subsets, the
# same epochs: the data-size curve), TTT length, learning rate (3e-4, 3e-3) and draft vocabulary. All but the vocabulary train
# on the bf16 store itself (run/train-NAME); the vocabulary changes the convert stage, so it gets a store of its
# own. With CHOICE_FRACTION=F < 1, seed, TTT, learning rate and vocabulary train on that fraction of the data
# (named NAME-fPCT) and are compared with the base at the same fraction (frac25 for 0.25), to spend a quarter of the
# GPU time on each. VARIANTS picks them; `eagle31`, `dflash` and `dspark` train that method (train.method) on the
# base store with the base's settings and evaluate it on every set (the methods side by side, docs/methods.md).
F=${CHOICE_FRACTION:-1}
PCT=$(${PY:-python3} -c "print(round($F * 100))")
declare -A VARIANT=([seed1]="--set train.seed=1" [frac25]="--set train.data_fraction=0.25"
                    [frac50]="--set train.data_fraction=0.5" [ttt3]="--set train.ttt_steps=3"
                    [lr3e-4]="--set train.lr=3e-4" [lr3e-3]="--set train.lr=3e-3" [vocab8k]="--set train.draft_vocab_size=8192 --reuse-data $R/$BASE"
                    [eagle31]="--set train.method=eagle3.1" [dflash]="--set train.method=dflash"
                    [dspark]="--set train.method=dspark")  # other draft methods on the same store (docs/methods.md)
# a block drafter is also evaluated at its whole block (train.block_size 16: 15 drafted tokens), the length SGLang serves
BLOCK_K="--set evaluate.compare_steps=[3,5,15]"
for v in ${VARIANTS-seed1 frac25 frac50 ttt3 lr3e-4 vocab8k}; do
  name=$v; args=${VARIANT[$v]}
  if [ "$PCT" != 100 ] && [[ $v != frac* ]]; then name=$v-f$PCT; args="$args --set train.data_fraction=$F"; fi
  if [ $v = vocab8k ]; then args="--root $R/$name $args"; else args="--root $R/$BASE $args --train-name $name"; fi
  if [ $v = eagle31 ]; then  # a method, not a training choice: every set at the base's chain lengths
    chain $name "$args" "$SETS" "$BASE_K" & pids+=($!)
  elif [ $v = dflash ] || [ $v = dspark ]; then
    chain $name "$args" "$SETS" "$BLOCK_K" & pids+=($!)
  else
    chain $name "$args" "varied humaneval" "$K3" & pids+=($!)
  fi
done
for p in "${pids[@]}"; do wait $p; done
# the epoch curve: earlier checkpoints of the base draft on the varied set
if [ "${CURVE:-1}" = 1 ]; then
  last=$(${PY:-python3} -c "import json;print(json.load(open('$R/$BASE/run/train/checkpoints/latest.json'))['step'])")
  for s in $(for f in 1 2 3 5 7; do echo $(( (last * f / 10 + 25) / 50 * 50 )); done | sort -un); do
    [ $s -ge 50 ] && [ $s -lt $last ] || continue
    $Q --root $R/$BASE $DATA $TRAIN $K3 --eval-only varied --checkpoint $s > $L/$BASE-eval-varied-step$s.log 2>&1 &
  done
  wait
fi
step DONE
