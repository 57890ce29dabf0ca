"""Tiny random-weight targets of the architectures users serve, to prove each stage on CPU in seconds.

Each is a Hugging Face model directory built from the real family's transformers config, shrunk (4-6 layers,
hidden 64, a few experts) but keeping what makes the family different: MLA with first-k-dense layers and shared
experts (DeepSeek-V3 / Kimi), MoE (Qwen3-MoE, GPT-OSS), QK-norm (Qwen3), sliding-window layers and attention
sinks (GPT-OSS). The tokenizer and chat template are the demo model's (SmolLM2), so the vocabulary is 49,152 in
every config. Weights come from a fixed seed, so a directory is the same bytes each time it is built; it is built
once under <data_dir>/models/tiny-<arch>/ and reused (install.json records the recipe version and hashes).

Rope: each keeps its family's real RoPE: yarn for DeepSeek-V3 / Kimi and GPT-OSS (their published parameters),
plain for the others. The draft does not copy yarn: eagle3/draft/model.py DraftConfig.from_target says what it does.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from eagle3.model_files import (
    TESTED_ARCHITECTURES,
    TOKENIZER_FILES,
    ModelError,
    ensure_demo_model,
    model_fingerprint,
)
from eagle3.store.fsio import atomic_write_json, fsync_dir

#: Bumped when a recipe below changes, so cached directories are rebuilt.
TINY_VERSION = 3
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

#: The real models' RoPE (their config.json files): yarn over a 4,096-token original context.
DEEPSEEK_V3_ROPE = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "beta_fast": 32.0, "beta_slow": 1.0,
                    "mscale": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096}  # fmt: skip
GPT_OSS_ROPE = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                "truncate": False, "original_max_position_embeddings": 4096}  # fmt: skip

#: architecture -> (transformers config class, overrides of _COMMON). 8 layers: the EAGLE-3 default aux layers
#: (2, L//2, L-3) are then (2, 4, 5), three distinct layers with a neighbour on each side.
RECIPES: dict[str, tuple[str, dict[str, Any]]] = {
    "LlamaForCausalLM": ("LlamaConfig", {"num_hidden_layers": 8}),
    "Qwen3ForCausalLM": ("Qwen3Config", {"num_hidden_layers": 8}),
    "Qwen3MoeForCausalLM": (
        "Qwen3MoeConfig",
        {
            "num_hidden_layers": 8,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [0],
            "norm_topk_prob": True,
        },
    ),
    "DeepseekV3ForCausalLM": (
        "DeepseekV3Config",
        {
            "num_hidden_layers": 8,
            "num_key_value_heads": 4,
            "head_dim": 16,
            "q_lora_rank": 32,
            "kv_lora_rank": 16,
            "qk_rope_head_dim": 16,
            "qk_nope_head_dim": 16,
            "v_head_dim": 16,
            "first_k_dense_replace": 2,
            "n_routed_experts": 8,
            "n_shared_experts": 1,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "n_group": 2,
            "topk_group": 1,
            "routed_scaling_factor": 2.5,
            "norm_topk_prob": True,
            "topk_method": "noaux_tc",
            "scoring_func": "sigmoid",
            "rope_interleave": True,
            "moe_layer_freq": 1,  # in the real config.json; SGLang's deepseek_v2.py reads it
            "rope_parameters": DEEPSEEK_V3_ROPE,
            "max_position_embeddings": 163840,  # 40 x 4096, as yarn's factor implies
        },
    ),
    "GptOssForCausalLM": (
        "GptOssConfig",
        {
            "num_hidden_layers": 8,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "intermediate_size": 64,
            "sliding_window": 8,
            "attention_bias": True,
            "layer_types": ["sliding_attention", "full_attention"] * 4,
            "rope_parameters": GPT_OSS_ROPE,
            "max_position_embeddings": 131072,  # 32 x 4096
        },
    ),
}
ARCHITECTURES: tuple[str, ...] = TESTED_ARCHITECTURES
assert tuple(RECIPES) == ARCHITECTURES, "a recipe for each tested architecture (eagle3.model_files)"


def tiny_model_dir(data_dir: Path, arch: str) -> Path:
    return Path(data_dir) / "models" / f"tiny-{arch}"


def tiny_config(arch: str) -> Any:
    """The transformers config of the tiny `arch` (KeyError-free: an unknown name is a ModelError)."""
    if arch not in RECIPES:
        raise ModelError(f"no tiny recipe for {arch!r}; known: {', '.join(ARCHITECTURES)}")
    import transformers

    cls_name, overrides = RECIPES[arch]
    cfg = getattr(transformers, cls_name)(**{**_COMMON, **overrides})
    cfg.architectures = [arch]
    return cfg


def _recipe_stamp(arch: str) -> dict[str, Any]:
    return {"arch": arch, "tiny_version": TINY_VERSION, "seed": SEED, "recipe": RECIPES[arch][1]}


def ensure_tiny_model(data_dir: Path, arch: str) -> Path:
    """Build the tiny `arch` target once (about a second) and return its directory."""
    if arch not in RECIPES:
        raise ModelError(f"no tiny recipe for {arch!r}; known: {', '.join(ARCHITECTURES)}")
    target = tiny_model_dir(data_dir, arch)
    stamp = target / "install.json"
    want = _recipe_stamp(arch)
    if stamp.is_file():
        rec = json.loads(stamp.read_text())
        if {k: rec.get(k) for k in want} == want and rec.get("model_sha256") == model_fingerprint(target):
            return target
    cfg = tiny_config(arch)
    demo = ensure_demo_model(data_dir)

    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    torch.nn.Module.to(model, dtype=torch.bfloat16)  # the plain Module method; transformers wraps .to
    model.config.dtype = torch.bfloat16
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".tiny-{arch}."))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        for name in TOKENIZER_FILES:
            if (demo / name).is_file():
                shutil.copyfile(demo / name, tmp / name)
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
        fsync_dir(target.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    atomic_write_json(stamp, {**want, "model_sha256": model_fingerprint(target)})
    return target
