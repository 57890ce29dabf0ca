"""A target model directory: the facts read from its config.json, its fingerprints, its weight map, and the check
that an engine can run it. Never guessed from the path (STYLE.md: no behaviour from names)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3.target.families import LAYERS_KEYS, TESTED_ARCHITECTURES, family_of
from eagle3.target.layout import text_config

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
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


def read_target_config(model_dir: Path) -> dict[str, Any]:
    """The model directory's config.json, as a dict."""
    cfg_path = Path(model_dir) / "config.json"
    if not cfg_path.is_file():
        raise ModelError(f"{model_dir}: no config.json; `model` must be a Hugging Face model directory or `demo`")
    cfg: dict[str, Any] = json.loads(cfg_path.read_text())
    return cfg


def layer_count(cfg: dict[str, Any], text: dict[str, Any]) -> int:
    """The decoder layers, as SGLang counts them: its row's layers_keys, the first present (families.py)."""
    family = family_of(str(text.get("model_type") or cfg.get("model_type", "")))
    keys = family.layers_keys if family is not None else LAYERS_KEYS
    key = next((k for k in keys if text.get(k) is not None), keys[0])
    return int(text[key])  # a KeyError names the first key


def read_model_facts(model_dir: Path) -> ModelFacts:
    return model_facts(read_target_config(model_dir), model_dir / "config.json")


def model_facts(cfg: dict[str, Any], cfg_path: Path) -> ModelFacts:
    """The facts of a config.json already read (`cfg_path` names it in the error for a missing key)."""
    text = text_config(cfg)
    try:
        return ModelFacts(
            model_type=str(cfg.get("model_type", "")),
            num_layers=layer_count(cfg, text),
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


def hyper_connection_problem(model_dir: Path) -> str | None:
    """Why transformers cannot give this target's states (None: it can): its decoder layers mix several
    hyper-connection streams per token (GLM-5-Next: config.json hc_mult), so no layer input is one residual stream."""
    cfg = read_target_config(model_dir)
    streams = int(text_config(cfg).get("hc_mult") or 1)
    if streams <= 1:
        return None
    model_type = cfg.get("model_type", "")
    return (
        f"{model_dir}: model_type {model_type!r} mixes {streams} hyper-connection streams per token (config.json "
        f"hc_mult {streams}): its decoder layers take {streams} streams, not one residual stream, so the "
        "transformers engine (and the offline evaluator, which runs the target in process) has no such state to "
        "store or feed a draft, and SGLang 0.5.23 feeds a draft of it a contraction of the streams, which this "
        "pipeline does not train against. Not supported: serve another family (docs/models.md, GLM-5-Next)."
    )


def check_target(model_dir: Path, engine: str) -> ModelFacts:
    """Refuse, before any model loads or server starts, a target that `engine` cannot run or whose tokenizer
    produces ids the model has no embedding for. A config vocabulary larger than the tokenizer's is normal (padded
    for the GPU: Qwen3 151,936 vs 151,669 tokens) and accepted. SGLang's model families are checked where its layer
    ids are derived (eagle3/serving/layers.py, from the rows of eagle3/target/families.py), which every SGLang
    server needs before it starts."""
    facts = read_model_facts(Path(model_dir))
    if engine == "transformers":
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as causal_lms
        from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES as wrappers

        if facts.model_type not in causal_lms and facts.model_type not in wrappers:  # eagle3/target/load.py
            raise ModelError(
                f"{model_dir}: architecture {'/'.join(facts.architectures) or '?'} (model_type {facts.model_type!r}) "
                "is not supported by the transformers engine: transformers has no causal LM or image-text-to-text "
                f"model for it. Tested: {', '.join(TESTED_ARCHITECTURES)} (docs/models.md); any model_type "
                "transformers' AutoModelForCausalLM or AutoModelForImageTextToText loads may work. A model only its "
                "own code loads (trust_remote_code) is not loaded: use server.engine sglang, or point `model` at a "
                "directory of its text backbone."
            )
        if problem := hyper_connection_problem(Path(model_dir)):
            raise ModelError(problem)
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
