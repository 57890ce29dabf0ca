"""Tiny random-weight targets of the architectures users serve, to prove each stage on CPU in seconds.

Each is a Hugging Face model directory built from the real family's transformers config, shrunk (8 layers, hidden
64, a few experts) but keeping what makes the family different: its recipe is its row's in families.py. The
tokenizer and chat template are the demo model's (SmolLM2), so the vocabulary is 49,152 in every config. Weights come
from a fixed seed, so a directory is the same bytes each time it is built; it is built once under
<data_dir>/models/tiny-<arch>/ and reused (install.json records the recipe version and hashes). Built by
`eagle3 model tiny ARCH` and the tests' `tiny_models` fixture (tests/conftest.py).

Rope: each keeps its family's real RoPE: yarn for DeepSeek-V3 / Kimi and GPT-OSS (their published parameters),
plain for the others. The draft does not copy yarn: eagle3/draft/shape.py DraftConfig.from_target says what it does.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

from eagle3.store.fsio import atomic_write_json
from eagle3.target.demo import ensure_demo_model
from eagle3.target.families import TESTED_ARCHITECTURES, TinyRecipe, family_named
from eagle3.target.files import TOKENIZER_FILES, ModelError, model_fingerprint
from eagle3.target.install import installing
from eagle3.target.load import auto_class_of

#: Bumped when a recipe (families.py) or _COMMON changes, so cached directories are rebuilt.
TINY_VERSION = 5  # 5: config.json names the real checkpoints' architecture (Kimi-K2.5); 4: deep-copied recipes
SEED = 1234
VOCAB = 49152  # the demo tokenizer's; every tiny config must match it (read_model_facts vs tokenizer check)

_COMMON: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 2,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}

#: The architectures with a tiny target: the rows of families.py with a recipe.
ARCHITECTURES: tuple[str, ...] = TESTED_ARCHITECTURES


def tiny_model_dir(data_dir: Path, arch: str) -> Path:
    return Path(data_dir) / "models" / f"tiny-{arch}"


def recipe(arch: str) -> TinyRecipe:
    """The tiny recipe of `arch` (an unknown name, or a row without one, is a ModelError)."""
    family = family_named(arch)
    if family is None or family.tiny is None:
        raise ModelError(f"no tiny recipe for {arch!r}; known: {', '.join(ARCHITECTURES)}")
    return family.tiny


def tiny_config(arch: str) -> Any:
    """The transformers config of the tiny `arch` (KeyError-free: an unknown name is a ModelError)."""
    tiny = recipe(arch)
    import transformers

    # A copy: config classes change the dicts they are given in place (Phi-3 adds partial_rotary_factor to
    # rope_parameters, Gemma a dict per layer type), and the next family built in this process would inherit it.
    text = copy.deepcopy({**_COMMON, **tiny.overrides})
    if tiny.wrapper is None:
        cfg = getattr(transformers, tiny.config_class)(**text)
    else:  # the language model's keys under text_config, the vision tower's beside it
        cfg = getattr(transformers, tiny.config_class)(text_config=text, **copy.deepcopy(tiny.wrapper))
    cfg.architectures = [arch]
    return cfg


def _recipe_stamp(arch: str) -> dict[str, Any]:
    tiny = recipe(arch)
    return {"arch": arch, "tiny_version": TINY_VERSION, "seed": SEED, "recipe": tiny.overrides,
            **({"config_json": tiny.config_json} if tiny.config_json else {}),
            **({"wrapper": tiny.wrapper} if tiny.wrapper is not None else {})}  # fmt: skip


def config_json(arch: str, written: dict[str, Any]) -> dict[str, Any]:
    """The config.json of the tiny `arch`, from the one transformers `written`: the real checkpoints' architecture
    name (transformers writes its class's: Kimi_K25ForConditionalGeneration, where the checkpoints and SGLang say
    KimiK25ForConditionalGeneration) and the recipe's config_json (a wrapper's into its text_config, but for a
    `vision_config` entry, into its vision_config)."""
    tiny = recipe(arch)
    saved = copy.deepcopy(written)
    saved["architectures"] = [arch]
    extra = dict(tiny.config_json)
    if tiny.wrapper is None:
        return saved | extra
    saved["vision_config"] |= extra.pop("vision_config", {})
    saved["text_config"] |= extra
    return saved


def image_processor_config(model_type: str) -> dict[str, Any] | None:
    """The preprocessor_config.json a wrapper's checkpoint ships (transformers' default image processor of its
    model_type, or of the dense one for `_moe`), named as the real files name it; just the name where the class does
    not build here (it needs torchvision): the loader then takes its defaults. None: transformers knows none."""
    import transformers
    from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES as names

    classes = names.get(model_type) or names.get(model_type.removesuffix("_moe")) or {}
    canonical = classes.get("torchvision") or next(iter(classes.values()), None)
    for name in sorted(classes.values(), key=lambda n: not n.endswith("Pil")):  # the PIL one needs no torchvision
        try:
            config: dict[str, Any] = getattr(transformers, name)().to_dict()
        except (ImportError, AttributeError, TypeError, ValueError):
            continue
        return {**config, "image_processor_type": canonical}
    return None if canonical is None else {"image_processor_type": canonical}  # its defaults, where it loads


def ensure_tiny_model(data_dir: Path, arch: str) -> Path:
    """Build the tiny `arch` target once (about a second) and return its directory."""
    want = _recipe_stamp(arch)  # an unknown `arch` is refused here
    target = tiny_model_dir(data_dir, arch)
    stamp = target / "install.json"
    if stamp.is_file():
        rec = json.loads(stamp.read_text())
        if {k: rec.get(k) for k in want} == want and rec.get("model_sha256") == model_fingerprint(target):
            return target
    cfg = tiny_config(arch)
    demo = ensure_demo_model(data_dir)

    import torch

    torch.manual_seed(SEED)
    model = auto_class_of(cfg.to_dict()).from_config(cfg, dtype=torch.float32)  # as the engine will load it
    torch.nn.Module.to(model, dtype=torch.bfloat16)  # the plain Module method; transformers wraps .to
    model.config.dtype = torch.bfloat16
    with installing(target) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        saved = config_json(arch, json.loads((tmp / "config.json").read_text()))
        (tmp / "config.json").write_text(json.dumps(saved, indent=2))
        for name in TOKENIZER_FILES:
            if (demo / name).is_file():
                shutil.copyfile(demo / name, tmp / name)
        if "text_config" in saved and (processor := image_processor_config(saved["model_type"])):  # a wrapper
            (tmp / "preprocessor_config.json").write_text(json.dumps(processor, indent=2))  # SGLang loads it
    atomic_write_json(stamp, {**want, "model_sha256": model_fingerprint(target)})
    return target
