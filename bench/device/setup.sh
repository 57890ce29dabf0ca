# Sourced by the device scripts: pydantic from carried wheels (.whl), the repo on PYTHONPATH, the 1.1B model.
set -x
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
[ -d .whl ] && [ -z "${NO_WHEELS:-}" ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -c "import torch, transformers, pyarrow, pydantic; print(torch.__version__, transformers.__version__, pyarrow.__version__, pydantic.VERSION)"
