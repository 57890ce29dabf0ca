# Watch a quality run (bench/device/quality.sh) for up to SECONDS, then bring its records back in $OUT/q.tgz, and
# its data (prompts, prepared, synthesized; for quality.sh's CORPUS next time) in $OUT/corpus.tgz.00, .01, ... once it is built,
# and the base draft (BASE, as quality.sh: bf16 unless set; its selected checkpoint, weights cast to bf16 to halve them) in $OUT/draft.tgz.00, ... once trained:
# evaluations the run did not do (longer answers, more prompts) then run on the CPU at home. BRING_CORPUS=0 / BRING_DRAFT=0 skip either
# (not CORPUS: quality.sh reads that one, and q_start.sh passes its environment to both).
# Usage: bash bench/device/q_poll.sh ROOT SECONDS
REPO=$PWD; R=${1:-/tmp/q}; B=${BASE:-bf16}
source bench/device/watch.sh
watch_run "$R" "${2:-500}"
cd "$R" && tar czf "${OUT:-/tmp}/q.tgz" steps driver.log logs $(ls -d */run/eval */run/train*/metrics.jsonl */run/train*/train.log */run/prompts/summary.json \
  */run/synthesized/summary.json */run/run.json */run/convert.json 2>/dev/null) 2>/dev/null; ls -la "${OUT:-/tmp}"
cd "$REPO"
if [ "${BRING_CORPUS:-1}" = 1 ] && grep -q "^[0-9]* data" "$R/steps" 2>/dev/null; then  # in 15 MiB parts: a file over 16 MiB does not come back
  tar czf - -C "$R" $B/run/prompts $B/run/prepared $B/run/synthesized | split -b 15m -d - "${OUT:-/tmp}/corpus.tgz."
  ls -la "${OUT:-/tmp}"/corpus.tgz.*
fi
if [ "${BRING_DRAFT:-1}" = 1 ] && grep -q "^[0-9]* trained $B" "$R/steps" 2>/dev/null; then
  PYTHONPATH=$REPO:/tmp/site ${PY:-python3} - "$R/$B/run/train" /tmp/draft_out <<'PY'
import shutil, sys
from pathlib import Path
from safetensors.torch import load_file, save_file
from eagle3.draft.checkpoint import WEIGHTS, resolve_checkpoint
src, dst = resolve_checkpoint(Path(sys.argv[1])), Path(sys.argv[2]) / "draft"
shutil.rmtree(dst.parent, ignore_errors=True); dst.mkdir(parents=True)
for f in src.iterdir():
    if f.name == WEIGHTS:
        save_file({k: v.bfloat16() if v.is_floating_point() else v for k, v in load_file(str(f)).items()}, str(dst / f.name))
    elif not f.name.startswith("optimizer"):
        shutil.copy(f, dst / f.name)
print("draft from", src, sorted(p.name for p in dst.iterdir()))
PY
  [ -d /tmp/draft_out/draft ] && tar czf - -C /tmp/draft_out draft | split -b 15m -d - "${OUT:-/tmp}/draft.tgz."
  ls -la "${OUT:-/tmp}"/draft.tgz.*
fi
