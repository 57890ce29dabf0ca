"""The target model families, one row per architecture: everything the pipeline keys on a family.

    architecture   the Hugging Face class name in config.json's `architectures` (the tiny target's name)
    model_types    config.json's `model_type` values of this architecture (how SGLang and the layer rule key it)
    sglang_rule    how SGLang 0.5.23's set_eagle3_layers_to_capture reads its ids (the rules and their arithmetic:
                   eagle3/serving/layers.py)
    attention      the draft's attention (DraftConfig.from_target): "gqa" copies the target's heads, "mla" gets
                   128-wide heads filling H, as the published DeepSeek-V3 / Kimi drafts are shaped
    tiny           the tiny random-weight target's recipe (tiny.py builds it), or None: a family SGLang has a rule for
                   that no test builds

What is the same for every family is not in the rows: the draft's RoPE (the target's when SGLang's Llama draft can
reproduce it, else plain at the target's theta; DraftConfig.from_target) and where a wrapper keeps the language model
(layout.py: every layout's keys are tried in turn). The tested architectures are the rows with a recipe:
tests/integration/test_architectures*.py run every stage on each. Adding an architecture is one row here plus its
tests (docs/models.md). Changing a recipe: bump tiny.TINY_VERSION, so cached tiny targets are rebuilt.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

SGLangRule = Literal["plus_one", "first_id_is_1", "gpt_oss"]
PLUS_ONE: SGLangRule = "plus_one"
FIRST_ID_IS_1: SGLangRule = "first_id_is_1"
GPT_OSS: SGLangRule = "gpt_oss"
SGLANG_RULES: tuple[SGLangRule, ...] = (PLUS_ONE, FIRST_ID_IS_1, GPT_OSS)

Attention = Literal["gqa", "mla"]


@dataclass(frozen=True)
class TinyRecipe:
    """A tiny target: the transformers config class and its overrides of tiny.py's common shrunk config."""

    config_class: str
    overrides: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Family:
    architecture: str
    model_types: tuple[str, ...]
    sglang_rule: SGLangRule
    attention: Attention = "gqa"
    tiny: TinyRecipe | None = None


#: The real models' RoPE (their config.json files): yarn over a 4,096-token original context.
DEEPSEEK_V3_ROPE = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "beta_fast": 32.0, "beta_slow": 1.0,
                    "mscale": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096}  # fmt: skip
GPT_OSS_ROPE = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                "truncate": False, "original_max_position_embeddings": 4096}  # fmt: skip

# The tiny recipes keep what makes the family different (MLA with first-k-dense layers and shared experts, MoE,
# QK-norm, sliding-window layers and attention sinks) and the family's real RoPE. 8 layers: the EAGLE-3 default aux
# layers (2, L//2, L-3) are then (2, 4, 5), three distinct layers with a neighbour on each side.
FAMILIES: tuple[Family, ...] = (
    Family("LlamaForCausalLM", ("llama",), PLUS_ONE, tiny=TinyRecipe("LlamaConfig", {"num_hidden_layers": 8})),
    Family("Qwen3ForCausalLM", ("qwen3",), PLUS_ONE, tiny=TinyRecipe("Qwen3Config", {"num_hidden_layers": 8})),
    Family(
        "Qwen3MoeForCausalLM",
        ("qwen3_moe",),
        PLUS_ONE,
        tiny=TinyRecipe(
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
    ),
    Family(
        "DeepseekV3ForCausalLM",
        ("deepseek_v3", "kimi_k2"),  # Kimi-K2 is a DeepseekV3ForCausalLM with its own model_type
        FIRST_ID_IS_1,
        attention="mla",
        tiny=TinyRecipe(
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
    ),
    Family(
        "GptOssForCausalLM",
        ("gpt_oss",),
        GPT_OSS,
        tiny=TinyRecipe(
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
    ),
    # SGLang has a layer-id rule for these; no tiny target proves them here.
    Family("MistralForCausalLM", ("mistral",), PLUS_ONE),
    Family("Qwen2ForCausalLM", ("qwen2",), PLUS_ONE),
    Family("Glm4MoeForCausalLM", ("glm4_moe",), PLUS_ONE),
    Family("MiniMaxM2ForCausalLM", ("minimax_m2",), PLUS_ONE),
    Family("DeepseekV2ForCausalLM", ("deepseek_v2",), FIRST_ID_IS_1, attention="mla"),
    Family("KimiK25ForConditionalGeneration", ("kimi_k25",), FIRST_ID_IS_1, attention="mla"),  # wraps DeepSeek-V3
)

#: The architectures every stage is tested on: the rows with a tiny recipe (the table in docs/models.md).
TESTED_ARCHITECTURES: tuple[str, ...] = tuple(f.architecture for f in FAMILIES if f.tiny is not None)
#: Every model_type with a row, for messages.
MODEL_TYPES: tuple[str, ...] = tuple(t for f in FAMILIES for t in f.model_types)
_BY_MODEL_TYPE = {t: f for f in FAMILIES for t in f.model_types}
_BY_ARCHITECTURE = {f.architecture: f for f in FAMILIES}
assert len(_BY_MODEL_TYPE) == len(MODEL_TYPES) and len(_BY_ARCHITECTURE) == len(FAMILIES), "one row per family"


def family_of(model_type: str) -> Family | None:
    """The row of a config.json `model_type`, or None for a family with no row."""
    return _BY_MODEL_TYPE.get(model_type)


def family_named(architecture: str) -> Family | None:
    """The row of a Hugging Face architecture (class) name, or None."""
    return _BY_ARCHITECTURE.get(architecture)
