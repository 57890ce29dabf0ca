#!/usr/bin/env bash
# Here, before a GPU run of the peers bench (bench/device/peers.sh): the wheels speculators 0.9.0 needs, as
# .venv-speculators resolved them, less what the device image has (torch and its dependencies, transformers and
# tokenizers, numpy, pyarrow: the large ones, never carried), for the device's Python 3.12, into .whl-peers/ (a call
# carries 64 MiB in all). On the device pip installs only those the image lacks or has too old.
#   bash bench/device/peer_wheels.sh        # then: run(..., carry=[".whl", ".whl-peers", ".dq2"])
set -euo pipefail
cd "$(dirname "$0")/../.."
# .venv-speculators' `pip freeze`, less torch and its own dependencies, transformers, tokenizers, numpy, pyarrow,
# pillow, and torchvision/torchaudio (required, never imported: bench/peers/speculators_train.py)
WHEELS=(speculators==0.9.0 hs-connectors==0.9.0 datasets==5.1.0 dill==0.4.1 multiprocess==0.70.19 xxhash==4.1.0
  aiohttp==3.14.5 aiohappyeyeballs==2.7.1 aiosignal==1.4.0 frozenlist==1.8.0 multidict==7.2.1 propcache==0.5.4
  yarl==1.25.1 attrs==26.1.0 loguru==0.7.3 openai==3.63.0 jiter==0.19.0 httpx==0.29.0 httpcore==1.0.9 h11==0.16.0
  anyio==4.16.0 sniffio==1.3.1 httpx2==2.17.0 httpcore2==2.17.0 truststore==0.10.5 pydantic-settings==2.16.3
  python-dotenv==1.2.4 typer==0.29.2 shellingham==1.5.4 annotated-doc==0.0.7 rich==15.0.0 markdown-it-py==4.3.0
  mdurl==0.1.2 Pygments==2.21.0 click==8.5.1 psutil==7.2.2 protobuf==7.36.2 pandas==3.1.1 python-dateutil==4.0.0
  tzdata==2026.6 huggingface_hub==2.4.0 hf-xet==1.8.0 fsspec==2026.7.0 filelock==4.3.2 packaging==26.4
  tqdm==4.70.1 PyYAML==6.0.4 idna==3.21 certifi==2026.10.19.post1 typing_extensions==4.16.0 safetensors==0.8.0)
rm -rf .whl-peers
.venv-speculators/bin/pip download -q --no-deps --only-binary :all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any -d .whl-peers "${WHEELS[@]}"
du -sh .whl-peers; ls .whl-peers | wc -l
