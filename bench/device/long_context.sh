# Acceptance against context length on one GPU (issue #47; docs/performance.md "Acceptance by context length"): two
# EAGLE-3 drafts of the demo target, trained by the pipeline's own stages (bench/quality_run.py, the varied corpus's
# recipe), and evaluated on held-out long multi-turn conversations cut at growing context lengths.
#   base  the varied corpus: SELF_INSTRUCT written requests and the demo prompts, two answers each (run 8's recipe,
#         smaller), data.max_length 1,024: a draft that never saw a long context
#   mix   the same rows, plus LONG - HELDOUT long conversations the target wrote itself: from LONG requests kept
#         out of the base data, synthesize writes TURNS1 (16) user turns and answers each: median 6.2K tokens,
#         up to the target's 8,192-token context on the H100 (docs/performance.md); with TURNS2 > 0 (default 0) a
#         second synthesize continues them by TURNS2 more (synthesize.regenerate none: the written turns kept;
#         at ~1.5K tok/s on the H100, 12 turns took over 12 minutes)
# The last HELDOUT long conversations are the evaluation set (split by conversation: no turn of them is trained),
# each cut before one assistant turn per context bucket (bench/long_acceptance.py). Both drafts are also evaluated
# on the varied set (nothing lost elsewhere). Logs in ROOT/logs, a line per finished step in ROOT/steps, the
# table in ROOT/report.md. Usage: bash bench/device/long_context.sh ROOT   (in its own session: long_start.sh)
# A CPU rehearsal (~3 minutes): NO_WHEELS=1 PY=.venv/bin/python SELF_INSTRUCT=8 LONG=6 HELDOUT=2 TURNS1=2
#   TURNS2=1 QEXTRA='--tiny --set prompts.include=[] --set prompts.max_new_tokens=24 --set synthesize.max_new_tokens=48
#   --set evaluate.max_new_tokens=8 --set train.heldout_fraction=0 --set train.select=last --set train.batch_tokens=4096
#   --set train.max_steps=2 --set train.draft_vocab_size=256' VARIED=2 DATA_DIR=data bash bench/device/long_context.sh /tmp/lcr
source bench/device/setup.sh   # run from the repository root (long_start.sh runs a copy of this file)
set +x
R=${1:-/tmp/lc}; L=$R/logs; mkdir -p "$L"; PY=${PY:-python3}
export PYTHONPATH=$PYTHONPATH:$PWD/bench TORCHINDUCTOR_CACHE_DIR=/tmp/inductor
D=${DATA_DIR:-/tmp/qdata}
Q="$PY bench/quality_run.py --config configs/varied-corpus.yaml --data-dir $D"
NL=${LONG:-192}; H=${HELDOUT:-32}
COMMON="--set extract.store_dtype=bfloat16 --set data.shard_size=1000 --set train.checkpoint_every=100
 --set train.keep_checkpoints=2 --set train.log_every=20 --set evaluate.offline_dtype=float32
 ${EPOCHS:+--set train.epochs=$EPOCHS} ${QEXTRA:-}"
step() { echo "$(date +%s) $*" >> "$R/steps"; }
fail() { step FAILED "$1"; tail -5 "$L/$1.log"; exit 1; }
step start
# 1. the corpus's requests (the prompts stage); the last LONG start the long conversations, the rest are the base data
$Q --root "$R/base" $COMMON --set prompts.self_instruct=${SELF_INSTRUCT:-1500} --until prompts > "$L/prompts.log" 2>&1 || fail prompts
P=$R/base/run/prompts/prompts.jsonl; M=$(( $(wc -l < "$P") - NL ))
[ "$M" -gt 0 ] || { step FAILED "prompts: $(wc -l < "$P") requests, LONG=$NL"; exit 1; }
tail -n "$NL" "$P" > "$R/long-prompts.jsonl"
BASE="$COMMON --set prompts.self_instruct=${SELF_INSTRUCT:-1500} --set synthesize.samples_per_prompt=2
 --set synthesize.user_turns=0 --set data.max_samples=$M"
$Q --root "$R/base" $BASE --until convert > "$L/base-data.log" 2>&1 || fail base-data
step base-data
# 2. the base draft trains while the target writes the long conversations
( $Q --root "$R/base" $BASE --until train > "$L/base-train.log" 2>&1 && step trained base || step FAILED base-train ) &
trainer=$!
LONGSET="$COMMON --set stages=[prepare,synthesize] --set data.max_length=8192 --set data.shard_size=100000
 --set synthesize.samples_per_prompt=1 --set synthesize.include_greedy=false"
$Q --root "$R/long1" $LONGSET --set data.dataset="$R/long-prompts.jsonl" --set synthesize.user_turns=${TURNS1:-16} \
  --until synthesize > "$L/long1.log" 2>&1 || fail long1
step long1
LONG_RUN=long1
if [ "${TURNS2:-0}" != 0 ]; then  # 0 (default): the first pass's conversations are the long ones
  $Q --root "$R/long2" $LONGSET --set data.dataset="$R/long1/run/synthesized/shard-00000.jsonl" \
    --set synthesize.user_turns=$TURNS2 --set synthesize.regenerate=none --until synthesize > "$L/long2.log" 2>&1 || fail long2
  step long2; LONG_RUN=long2
fi
MODEL=$($PY -c "from pathlib import Path; from eagle3.target.demo import resolve_model; print(resolve_model('demo', Path('$D')))")
$PY bench/long_acceptance.py split --conversations "$R/$LONG_RUN/run/synthesized/shard-00000.jsonl" --model "$MODEL" \
  --heldout "$H" --out "$R" > "$L/split.log" 2>&1 || fail split
cat "$R"/base/run/synthesized/shard-*.jsonl > "$R/base-conversations.jsonl"
step split "$(tail -1 "$L/split.log")"
# 3. the mix draft: the base rows (their answers as synthesized) and the long training conversations, one store
MIX="$COMMON --set stages=[prepare,extract,convert,train,evaluate] --set data.max_length=8192
 --set data.sources=[{\"dataset\":\"$R/base-conversations.jsonl\"},{\"dataset\":\"$R/long-train.jsonl\"}]"
$Q --root "$R/mix" $MIX --until train > "$L/mix-train.log" 2>&1 || fail mix-train
step trained mix
wait $trainer
# 4. both drafts on the long held-out set (a category per bucket) and the varied set, at k = 3, all at once
SETS="evaluate.sets=[{name: long, dataset: $R/long-eval.jsonl, kind: long multi-turn held-out, num_prompts: 100000},
 {name: varied, dataset: data/eval_varied_prompts.jsonl, kind: varied hand-written, num_prompts: ${VARIED:-48}}]"
for d in base mix; do
  args=$BASE; [ $d = mix ] && args=$MIX
  for s in long varied; do
    $Q --root "$R/$d" $args --set "$SETS" --set "evaluate.compare_steps=[3]" --eval-only $s > "$L/$d-eval-$s.log" 2>&1 &
  done
done
wait
step evaluated
$PY bench/long_acceptance.py report --eval base="$R/base/run/eval/offline-long.json" base="$R/base/run/eval/offline-varied.json" \
  mix="$R/mix/run/eval/offline-long.json" mix="$R/mix/run/eval/offline-varied.json" > "$R/report.md" 2>&1
cat "$R/report.md"
step DONE
