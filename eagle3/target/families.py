"""The target model families, one row per architecture: everything the pipeline keys on a family.

    architecture   the Hugging Face class name in config.json's `architectures` (the tiny target's name)
    model_types    config.json's `model_type` values of this architecture (how SGLang and the layer rule key it)
    sglang_files   the files of sglang/srt/models/ (0.5.23) whose capture serves it: the contract was read there, and
                   tests/unit/target/test_sglang_source.py fails when a file that captures has no row
    sglang_rule    how SGLang's set_eagle3_layers_to_capture reads its ids (the rules and their arithmetic:
                   eagle3/serving/layers.py), or None: SGLang 0.5.23 serves no EAGLE-3 draft of this family
    dflash_rule    how its set_dflash_layers_to_capture reads block drafters' `target_layer_ids`, or None
    tap            what SGLang hands the draft for a captured layer (TAPS); tap_when: the config keys (the language
                   model's config) that, when set, change it
    attention      the draft's attention (DraftConfig.from_target): "gqa" copies the target's heads, "mla" gets
                   128-wide heads filling H, as the published DeepSeek-V3 / Kimi drafts are shaped; None: read from
                   the config (a `kv_lora_rank` is MLA)
    tiny           the tiny random-weight target's recipe (tiny.py builds it), or None: a family no test builds
    layers_keys    the config keys that count its decoder layers, the first one present: what SGLang builds and
                   numbers its ids by, and HF `hidden_states` has that count + 1 entries

What is the same for every family is not in the rows: the draft's RoPE (the target's when SGLang's Llama draft can
reproduce it, else plain at the target's theta; DraftConfig.from_target) and where a wrapper keeps the language model
(layout.py: every layout's keys are tried in turn). The tested architectures are the rows with a recipe:
tests/integration/test_architectures*.py run every stage on each. Adding an architecture is one row here plus its
tests (docs/models.md). Changing a recipe: bump tiny.TINY_VERSION, so cached tiny targets are rebuilt.

The tap is the contract with serving (docs/models.md, "What SGLang feeds the draft"): the pipeline stores and checks
the residual stream entering a layer (HF `hidden_states[i]`), which is what SGLang 0.5.23 captures for every family
whose tap is RESIDUAL. A family whose tap is anything else is refused before the first stage that would store or
serve its states (eagle3/checks/preflight.py), with the reason: a draft trained on states the server does not feed
it is slower than no draft.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

SGLangRule = Literal["plus_one", "first_id_is_1", "gpt_oss"]
PLUS_ONE: SGLangRule = "plus_one"
FIRST_ID_IS_1: SGLangRule = "first_id_is_1"
GPT_OSS: SGLangRule = "gpt_oss"
SGLANG_RULES: tuple[SGLangRule, ...] = (PLUS_ONE, FIRST_ID_IS_1, GPT_OSS)

#: set_dflash_layers_to_capture: "plus_one" and "after" both mean id k = the output of layer k (+1 in the setter, or
#: the id as-is with the capture after the layer); "before": id k = the input of layer k (Muse Glimmer).
DFlashRule = Literal["plus_one", "after", "before"]

Tap = Literal[
    "residual", "gemma3", "hyper_connections", "pre_sconv", "attention_residual_mix", "loop_folded", "unknown"
]
RESIDUAL: Tap = "residual"
#: What each tap is, read in SGLang 0.5.23's model files (the messages quote it).
TAPS: dict[str, str] = {
    "residual": "the residual stream entering the layer (HF hidden_states[i])",
    "gemma3": "not the residual stream: gemma3_causal.py appends the previous layer's post-feedforward-normed MLP "
    "output, which on CUDA the next layer's fused add-RMSNorm then overwrites in place with that layer's normalized "
    "input; on CPU it stays the MLP output. Neither is HF hidden_states[i], and the two devices differ",
    "hyper_connections": "the flattened hyper-connection streams (mhc: hc_mult x hidden_size wide), not one "
    "residual stream",
    "pre_sconv": "the residual plus the MLP output before the layer's short convolution (use_sconv), which is not "
    "the residual stream",
    "attention_residual_mix": "the attention-residual bank's mixture the next layer reads (attn_res_block_size), "
    "not the residual stream",
    "loop_folded": "the unrolled depth of a looped model, whose taps at a loop start are the folded, normed loop "
    "output, not the residual stream",
    "unknown": "implemented outside SGLang (sgl_mindspore), so its tap cannot be read from SGLang's source",
}

Attention = Literal["gqa", "mla"]
#: The config key that counts a model's decoder layers, for every family but those whose row says otherwise.
LAYERS_KEYS: tuple[str, ...] = ("num_hidden_layers",)


@dataclass(frozen=True)
class TinyRecipe:
    """A tiny target: the transformers config class and its overrides of tiny.py's common shrunk config."""

    config_class: str
    overrides: dict[str, Any] = field(default_factory=dict)
    #: Keys the real checkpoints' config.json carries that the transformers class does not write back (it derives
    #: them, or never reads them) and SGLang reads: merged into the saved config.json (a wrapper's: into its
    #: text_config, and a `vision_config` entry into its vision_config).
    config_json: dict[str, Any] = field(default_factory=dict)
    #: A multimodal wrapper (`XForConditionalGeneration` around a language model): the wrapper's own keys (its
    #: vision tower's `vision_config`, shrunk), while `overrides` shrink its `text_config`. Built and loaded by
    #: transformers' image-text-to-text auto class; the pipeline feeds it text only. None: a causal LM.
    wrapper: dict[str, Any] | None = None


@dataclass(frozen=True)
class Family:
    architecture: str
    model_types: tuple[str, ...]
    sglang_files: tuple[str, ...]
    sglang_rule: SGLangRule | None
    dflash_rule: DFlashRule | None = None
    tap: Tap = RESIDUAL
    tap_when: tuple[tuple[str, Tap], ...] = ()
    attention: Attention | None = None
    tiny: TinyRecipe | None = None
    layers_keys: tuple[str, ...] = LAYERS_KEYS

    def tap_of(self, text_config: dict[str, Any]) -> Tap:
        """The tap for a model of this family with this (language model) config."""
        return next((tap for key, tap in self.tap_when if text_config.get(key)), self.tap)


#: The real models' RoPE (their config.json files): yarn over a 4,096-token original context.
DEEPSEEK_V3_ROPE = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "beta_fast": 32.0, "beta_slow": 1.0,
                    "mscale": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096}  # fmt: skip
DEEPSEEK_V2_ROPE = {**DEEPSEEK_V3_ROPE, "mscale": 0.707, "mscale_all_dim": 0.707}  # DeepSeek-V2's config.json
GPT_OSS_ROPE = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                "truncate": False, "original_max_position_embeddings": 4096}  # fmt: skip

#: MLA at the tiny size (DeepSeek-V3, DeepSeek-V2 and GLM-4.7-Flash share the attention).
TINY_MLA = {"num_hidden_layers": 8, "num_key_value_heads": 4, "head_dim": 16, "q_lora_rank": 32, "kv_lora_rank": 16,
            "qk_rope_head_dim": 16, "qk_nope_head_dim": 16, "v_head_dim": 16}  # fmt: skip
#: DeepSeek's routed and shared experts at the tiny size, grouped routing (DeepSeek-V3's and V2's recipes).
TINY_DEEPSEEK_MOE = {"n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
                     "moe_intermediate_size": 32, "n_group": 2, "topk_group": 1}  # fmt: skip
#: Qwen3-Next / Qwen3.5's gated DeltaNet linear attention on 3 layers of 4.
GATED_DELTA_NET = {"linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
                   "linear_value_head_dim": 16}  # fmt: skip
#: What Qwen3-Next's config.json says of the same layout (transformers turns it into layer_types; SGLang reads it).
FULL_ATTENTION_EVERY_4 = {"full_attention_interval": 4}
QWEN3_NEXT_TINY = {"num_hidden_layers": 8, **GATED_DELTA_NET, "num_experts": 4, "num_experts_per_tok": 2,
                   "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32}  # fmt: skip
#: Text recipes a multimodal wrapper of the same language model shares (its row's `wrapper` adds the vision tower).
LLAMA4_TINY = {
    "num_hidden_layers": 8,
    "num_local_experts": 4,  # MoE on every layer, top-1 plus a shared expert
    "intermediate_size": 32,
    "intermediate_size_mlp": 128,
    "attention_chunk_size": 8,  # chunked attention on 3 layers of 4; NoPE on the 4th
}
QWEN3_MOE_TINY = {"num_hidden_layers": 8, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                  "decoder_sparse_step": 1, "mlp_only_layers": [0], "norm_topk_prob": True}  # fmt: skip
QWEN3_5_TINY = {"num_hidden_layers": 8, **GATED_DELTA_NET}
GEMMA3_TINY = {"num_hidden_layers": 8, "sliding_window": 8, "query_pre_attn_scalar": 16,
               "hidden_activation": "gelu_pytorch_tanh"}  # fmt: skip
DEEPSEEK_V3_TINY = {
    **TINY_MLA,
    "first_k_dense_replace": 2,
    **TINY_DEEPSEEK_MOE,
    "routed_scaling_factor": 2.5,
    "norm_topk_prob": True,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "rope_interleave": True,
    "moe_layer_freq": 1,  # in the real config.json; SGLang's deepseek_v2.py reads it
    "rope_parameters": DEEPSEEK_V3_ROPE,
    "max_position_embeddings": 163840,  # 40 x 4096, as yarn's factor implies
}
GEMMA4_TINY = {
    "num_hidden_layers": 8,
    "sliding_window": 8,
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size_per_layer_input": 16,  # the per-layer input embeddings
    "vocab_size_per_layer_input": 49152,
    "layer_types": ["sliding_attention"] * 3 + ["full_attention"] + ["sliding_attention"] * 3 + ["full_attention"],
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6},
    },
}
#: Qwen's VL language models rotate by 3-D positions (time, height, width) in sections of the rotary half; text
#: alone has the three equal, plain RoPE. The sections at head_dim 16 (the real 128 has [16, 24, 24]).
MROPE_TINY = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}
QWEN3_VL_ROPE_TINY = {**MROPE_TINY, "mrope_interleaved": True}  # Qwen3-VL's and Qwen3.5's: sections interleaved
#: Qwen's vision towers at the tiny size: the pipeline never feeds them an image, but the wrapper must build.
QWEN_VISION_TINY = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 64}
QWEN3_5_VISION_TINY = {**QWEN_VISION_TINY, "num_position_embeddings": 16}
QWEN3_VISION_TINY = {**QWEN3_5_VISION_TINY, "deepstack_visual_indexes": [1]}
#: A SigLIP-style tower (Llama-4's, Gemma's, Kimi's MoonViT) at the tiny size.
VISION_TINY = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2}
#: LFM2's short convolutions and attention layers.
LFM2_LAYERS = ["conv", "conv", "full_attention"] * 2 + ["conv", "full_attention"]

# The tiny recipes keep what makes the family different (MLA with first-k-dense layers and shared experts, MoE,
# QK-norm, sliding-window layers and attention sinks) and the family's real RoPE. 8 layers: the EAGLE-3 default aux
# layers (2, L//2, L-3) are then (2, 4, 5), three distinct layers with a neighbour on each side.
FAMILIES: tuple[Family, ...] = (
    Family(
        "LlamaForCausalLM",
        ("llama",),
        ("llama.py",),
        PLUS_ONE,
        "plus_one",
        attention="gqa",
        tiny=TinyRecipe("LlamaConfig", {"num_hidden_layers": 8}),
    ),
    Family(
        "Qwen3ForCausalLM",
        ("qwen3",),
        ("qwen3.py",),
        PLUS_ONE,
        "plus_one",
        attention="gqa",
        tiny=TinyRecipe("Qwen3Config", {"num_hidden_layers": 8}),
    ),
    Family(
        "Qwen3MoeForCausalLM",
        ("qwen3_moe",),
        ("qwen3_moe.py", "qwen2_moe.py"),
        PLUS_ONE,
        "plus_one",
        attention="gqa",
        tiny=TinyRecipe("Qwen3MoeConfig", QWEN3_MOE_TINY),
    ),
    Family(
        "DeepseekV3ForCausalLM",
        ("deepseek_v3", "kimi_k2"),  # Kimi-K2 is a DeepseekV3ForCausalLM with its own model_type
        ("deepseek_v2.py",),
        FIRST_ID_IS_1,
        "plus_one",
        attention="mla",
        tiny=TinyRecipe("DeepseekV3Config", DEEPSEEK_V3_TINY),
    ),
    Family(
        "GptOssForCausalLM",
        ("gpt_oss",),
        ("gpt_oss.py",),
        GPT_OSS,
        "plus_one",
        attention="gqa",
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
    # No tiny target proves these here; their rows are read from SGLang 0.5.23's source (docs/models.md).
    # Llama's capture, inherited (mistral.py, llama4.py) or its own copy of it:
    Family(
        "MistralForCausalLM",
        ("mistral",),
        ("llama.py",),
        PLUS_ONE,
        "plus_one",
        attention="gqa",
        tiny=TinyRecipe("MistralConfig", {"num_hidden_layers": 8, "sliding_window": None}),  # as Mistral v0.2 on
    ),
    Family(
        "Phi3ForCausalLM",
        ("phi3",),
        ("llama.py",),
        PLUS_ONE,
        "plus_one",
        attention="gqa",
        tiny=TinyRecipe("Phi3Config", {"num_hidden_layers": 8}),  # fused qkv and gate_up
    ),
    Family("InternLM3ForCausalLM", ("internlm3",), ("llama.py",), PLUS_ONE, "plus_one"),
    Family(
        "Llama4ForCausalLM",
        ("llama4_text",),
        ("llama.py",),
        PLUS_ONE,
        attention="gqa",
        tiny=TinyRecipe("Llama4TextConfig", LLAMA4_TINY),
    ),
    Family(
        "Llama4ForConditionalGeneration",
        ("llama4",),
        ("mllama4.py", "llama.py"),
        PLUS_ONE,
        attention="gqa",
        tiny=TinyRecipe(
            "Llama4Config",
            LLAMA4_TINY,
            wrapper={
                "vision_config": {
                    **VISION_TINY,
                    "image_size": 32,
                    "patch_size": 8,
                    "vision_output_dim": 64,
                    "projector_input_dim": 64,
                    "projector_output_dim": 64,
                    "intermediate_layers_indices": [0],
                }
            },
        ),
    ),
    Family(
        "ApertusForCausalLM",
        ("apertus",),
        ("apertus.py",),
        PLUS_ONE,
        attention="gqa",
        tiny=TinyRecipe("ApertusConfig", {"num_hidden_layers": 8, "hidden_act": "xielu"}),  # and QK-norm
    ),
    Family(
        "Qwen2ForCausalLM",
        ("qwen2",),
        ("qwen2.py",),
        PLUS_ONE,
        attention="gqa",
        tiny=TinyRecipe("Qwen2Config", {"num_hidden_layers": 8}),
    ),
    Family(
        "Qwen2_5_VLForConditionalGeneration",
        ("qwen2_5_vl",),
        ("qwen2_5_vl.py",),
        PLUS_ONE,
        attention="gqa",
        tiny=TinyRecipe(
            "Qwen2_5_VLConfig",
            {"num_hidden_layers": 8, "rope_parameters": MROPE_TINY},
            wrapper={"vision_config": {**QWEN_VISION_TINY, "fullatt_block_indexes": [1], "window_size": 16}},
        ),
    ),
    Family(
        "Qwen2MoeForCausalLM",
        ("qwen2_moe",),
        ("qwen2_moe.py",),
        PLUS_ONE,
        attention="gqa",
        tiny=TinyRecipe(
            "Qwen2MoeConfig",
            {
                "num_hidden_layers": 8,
                "num_experts": 4,
                "num_experts_per_tok": 2,
                "moe_intermediate_size": 32,
                "shared_expert_intermediate_size": 64,  # the shared expert and its sigmoid gate
                "decoder_sparse_step": 1,
                "mlp_only_layers": [0],
            },
        ),
    ),
    Family(
        "Qwen3NextForCausalLM",
        ("qwen3_next",),
        ("qwen3_next.py",),
        PLUS_ONE,
        "plus_one",
        attention="gqa",
        tiny=TinyRecipe("Qwen3NextConfig", QWEN3_NEXT_TINY, FULL_ATTENTION_EVERY_4),
    ),
    Family(
        "Qwen3_5ForCausalLM",
        ("qwen3_5_text",),
        (
            "qwen3_5_text.py",
            "qwen3_5.py",
        ),
        PLUS_ONE,
        "plus_one",
        attention="gqa",
        tiny=TinyRecipe("Qwen3_5TextConfig", QWEN3_5_TINY, FULL_ATTENTION_EVERY_4),
    ),
    Family(
        "Qwen3_5MoeForCausalLM",
        ("qwen3_5_moe_text",),
        (
            "qwen3_5_text.py",
            "qwen3_5.py",
        ),
        PLUS_ONE,
        "plus_one",
        attention="gqa",
        tiny=TinyRecipe("Qwen3_5MoeTextConfig", QWEN3_NEXT_TINY, FULL_ATTENTION_EVERY_4),
    ),
    Family(
        "Qwen3_5ForConditionalGeneration",
        ("qwen3_5",),
        ("qwen3_5.py", "qwen3_vl.py"),
        PLUS_ONE,
        "plus_one",
        attention="gqa",
        tiny=TinyRecipe(
            "Qwen3_5Config",
            {**QWEN3_5_TINY, "rope_parameters": QWEN3_VL_ROPE_TINY},
            FULL_ATTENTION_EVERY_4,
            wrapper={"vision_config": QWEN3_5_VISION_TINY},
        ),
    ),
    Family(
        "Qwen3_5MoeForConditionalGeneration",
        ("qwen3_5_moe",),
        ("qwen3_5.py", "qwen3_vl.py"),
        PLUS_ONE,
        "plus_one",
        attention="gqa",
        tiny=TinyRecipe(
            "Qwen3_5MoeConfig",
            {**QWEN3_NEXT_TINY, "rope_parameters": QWEN3_VL_ROPE_TINY},
            FULL_ATTENTION_EVERY_4,
            wrapper={"vision_config": QWEN3_5_VISION_TINY},
        ),
    ),
    # Qwen3-VL's dense language model has no DFlash setter (SGLang raises AttributeError); its MoE one has.
    Family(
        "Qwen3VLForConditionalGeneration",
        ("qwen3_vl",),
        ("qwen3_vl.py",),
        PLUS_ONE,
        attention="gqa",
        tiny=TinyRecipe(
            "Qwen3VLConfig",
            {"num_hidden_layers": 8, "rope_parameters": QWEN3_VL_ROPE_TINY},
            wrapper={"vision_config": QWEN3_VISION_TINY},
        ),
    ),
    Family(
        "Qwen3VLMoeForConditionalGeneration",
        ("qwen3_vl_moe",),
        ("qwen3_vl.py",),
        PLUS_ONE,
        "plus_one",
        attention="gqa",
        tiny=TinyRecipe(
            "Qwen3VLMoeConfig",
            {**QWEN3_MOE_TINY, "rope_parameters": QWEN3_VL_ROPE_TINY},
            wrapper={"vision_config": QWEN3_VISION_TINY},
        ),
    ),
    Family(
        "ExaoneMoeForCausalLM",
        ("exaone_moe",),
        ("exaone_moe.py",),
        PLUS_ONE,
        attention="gqa",
        tiny=TinyRecipe(
            "ExaoneMoeConfig",
            {
                "num_hidden_layers": 8,
                "sliding_window": 8,  # 3 sliding layers of 4
                "num_experts": 4,
                "num_experts_per_tok": 2,
                "moe_intermediate_size": 32,
                "num_shared_experts": 1,
                "mlp_layer_types": ["dense"] + ["sparse"] * 7,
            },
        ),
    ),
    Family("BailingMoeForCausalLM", ("bailing_moe",), ("bailing_moe.py",), PLUS_ONE),
    Family("BailingMoeV2ForCausalLM", ("bailing_moe_v2",), ("bailing_moe.py",), PLUS_ONE),
    Family(
        "Glm4MoeForCausalLM",
        ("glm4_moe",),
        ("glm4_moe.py",),
        PLUS_ONE,
        attention="gqa",
        tiny=TinyRecipe(
            "Glm4MoeConfig",
            {
                "num_hidden_layers": 8,
                "n_routed_experts": 8,
                "n_shared_experts": 1,
                "num_experts_per_tok": 2,
                "moe_intermediate_size": 32,
                "first_k_dense_replace": 1,
                "n_group": 1,
                "topk_group": 1,
                "norm_topk_prob": True,
                "use_qk_norm": True,
                "partial_rotary_factor": 0.5,  # GLM-4.5's: RoPE on half of each head
            },
        ),
    ),
    Family(
        "Glm5NextForConditionalGeneration",
        ("glm5_next",),
        ("glm5_next.py",),
        PLUS_ONE,
        "plus_one",
        tap_when=(("mhc", "hyper_connections"),),
    ),
    Family(
        "Gemma4ForCausalLM",
        ("gemma4_text",),
        ("gemma4_causal.py",),
        PLUS_ONE,
        "plus_one",
        attention="gqa",
        tiny=TinyRecipe("Gemma4TextConfig", GEMMA4_TINY),
    ),
    Family(
        "Gemma4ForConditionalGeneration",
        ("gemma4",),
        ("gemma4_mm.py",),
        PLUS_ONE,
        "plus_one",
        attention="gqa",
        tiny=TinyRecipe(
            "Gemma4Config",
            GEMMA4_TINY,
            wrapper={"vision_config": {**VISION_TINY, "num_key_value_heads": 2, "head_dim": 16}, "audio_config": None},
        ),
    ),
    Family(
        "Gemma3ForCausalLM",
        ("gemma3_text",),
        ("gemma3_causal.py",),
        PLUS_ONE,
        tap="gemma3",
        attention="gqa",
        # A tiny target to prove the refusals on (tests/integration/test_refused_families.py), not a tested one.
        tiny=TinyRecipe("Gemma3TextConfig", GEMMA3_TINY),
    ),
    Family(
        "Gemma3ForConditionalGeneration",
        ("gemma3",),
        ("gemma3_mm.py", "gemma3_causal.py"),
        PLUS_ONE,
        tap="gemma3",
        attention="gqa",
        tiny=TinyRecipe(
            "Gemma3Config",
            GEMMA3_TINY,
            wrapper={"vision_config": {**VISION_TINY, "image_size": 32, "patch_size": 8}, "mm_tokens_per_image": 4},
        ),
    ),
    # Each decoder layer holds two attention blocks and two MLPs; the real config.json says `num_layers` (28), and
    # SGLang's configs/longcat_flash.py reads num_hidden_layers, else num_layers, as its count of decoder layers.
    # transformers' num_hidden_layers is a property (2 x num_layers, never saved) and its hidden_states has
    # num_layers + 1 entries: the decoder layers are what both number.
    Family(
        "LongcatFlashForCausalLM",
        ("longcat_flash",),
        ("longcat_flash.py",),
        PLUS_ONE,
        attention="mla",
        layers_keys=("num_hidden_layers", "num_layers"),
        tiny=TinyRecipe(
            "LongcatFlashConfig",
            {
                **{k: v for k, v in TINY_MLA.items() if k != "num_hidden_layers"},
                "num_layers": 8,  # 16 attention blocks
                "ffn_hidden_size": 128,
                "n_routed_experts": 8,
                "zero_expert_num": 4,  # identity experts: a token may skip the routed ones
                "moe_topk": 2,
                "expert_ffn_hidden_size": 32,
                "routed_scaling_factor": 6.0,
            },
        ),
    ),
    # MiniMax-M3's language model config says model_type minimax_m2 (sglang/srt/configs/minimax_vl.py): one rule.
    Family(
        "MiniMaxM2ForCausalLM",
        ("minimax_m2",),
        (
            "minimax_m2.py",
            "minimax_m3.py",
        ),
        PLUS_ONE,
        attention="gqa",
        tiny=TinyRecipe(
            "MiniMaxM2Config",
            {
                "num_hidden_layers": 8,
                "num_local_experts": 4,
                "num_experts_per_tok": 2,
                "intermediate_size": 32,
                # MiniMax-M2's config.json says what transformers' class always does and SGLang reads
                "scoring_func": "sigmoid",
                "use_routing_bias": True,
                "use_qk_norm": True,
                "qk_norm_type": "per_layer",
            },
        ),
    ),
    Family(
        "MiniMaxM3SparseForConditionalGeneration",
        ("minimax_m3_vl",),
        ("minimax_m3_vl.py",),
        PLUS_ONE,
        attention="gqa",
        # transformers 5.19's own MiniMax-M3 language model (minimax_m3_vl_text): routed and shared experts, partial
        # RoPE, and a block-sparse indexer at its real block size and top-k blocks (the tests' samples are shorter)
        tiny=TinyRecipe(
            "MiniMaxM3VLConfig",
            {
                "num_hidden_layers": 8,
                "num_local_experts": 4,
                "num_experts_per_tok": 2,
                "intermediate_size": 32,
                "dense_intermediate_size": 128,
                "shared_intermediate_size": 32,
                "rotary_dim": 8,
                "index_n_heads": 2,
                "index_head_dim": 16,
                "layer_types": ["full_attention"] * 8,
                "mlp_layer_types": ["sparse"] * 8,
            },
            wrapper={
                "vision_config": {**VISION_TINY, "image_size": 32, "patch_size": 8},
                "projector_hidden_size": 64,
                "merged_hidden_size": 128,
            },
        ),
    ),
    # DeepSeek's capture: the first id decides whether ids are shifted.
    Family(
        "DeepseekV2ForCausalLM",
        ("deepseek_v2",),
        ("deepseek_v2.py",),
        FIRST_ID_IS_1,
        "plus_one",
        attention="mla",
        tiny=TinyRecipe(
            "DeepseekV2Config",
            {
                **TINY_MLA,
                "first_k_dense_replace": 1,
                **TINY_DEEPSEEK_MOE,
                "topk_method": "group_limited_greedy",  # V2's softmax routing, as its config.json says
                "scoring_func": "softmax",
                "moe_layer_freq": 1,
                "rope_parameters": DEEPSEEK_V2_ROPE,
                "max_position_embeddings": 163840,
            },
        ),
    ),
    Family(
        "DeepseekV32ForCausalLM",
        ("deepseek_v32",),
        ("deepseek_v2.py",),
        FIRST_ID_IS_1,
        "plus_one",
        attention="mla",
        tiny=TinyRecipe(
            "DeepseekV32Config",
            {
                **TINY_MLA,
                "first_k_dense_replace": 1,
                **TINY_DEEPSEEK_MOE,
                "routed_scaling_factor": 2.5,
                "norm_topk_prob": True,
                "topk_method": "noaux_tc",
                "scoring_func": "sigmoid",
                "moe_layer_freq": 1,
                # the lightning indexer of DeepSeek Sparse Attention, shrunk, with the real top-2048 keys: the tests'
                # samples are shorter, and transformers' prefill past index_topk is not causal (preflight.py
                # sparse_attention_problems)
                "index_n_heads": 2,
                "index_head_dim": 16,
                "index_topk": 2048,
                "rope_parameters": DEEPSEEK_V3_ROPE,
                "max_position_embeddings": 163840,
            },
        ),
    ),
    Family(
        "KimiK25ForConditionalGeneration",
        ("kimi_k25",),
        ("kimi_k25.py", "deepseek_v2.py"),
        FIRST_ID_IS_1,
        "plus_one",
        attention="mla",
        # DeepSeek-V3 wrapped with a MoonViT tower; transformers 5.19 builds it natively (Kimi_K25Config)
        tiny=TinyRecipe(
            "Kimi_K25Config",
            DEEPSEEK_V3_TINY,
            # the checkpoint's names, which SGLang reads: its text_config's architecture, and its vision tower's
            # width under the original code's key (transformers 5.19 writes hidden_size)
            {"architectures": ["DeepseekV3ForCausalLM"], "vision_config": {"vt_hidden_size": 32}},
            wrapper={
                "vision_config": {**VISION_TINY, "pos_emb_height": 8, "pos_emb_width": 8},
                "projection_hidden_size": 32,
                "tie_word_embeddings": False,
            },
        ),
    ),
    Family(
        "GlmMoeDsaForCausalLM",
        ("glm_moe_dsa",),
        ("glm4_moe.py", "deepseek_v2.py"),
        FIRST_ID_IS_1,
        "plus_one",
        attention="mla",
        # GLM-5: MLA and DeepSeek's MoE with DeepSeek Sparse Attention's indexer, at its real top-2048 keys (as
        # DeepSeek-V3.2's recipe: preflight.py sparse_attention_problems)
        tiny=TinyRecipe(
            "GlmMoeDsaConfig",
            {
                **TINY_MLA,
                **TINY_DEEPSEEK_MOE,
                "n_group": 1,
                "topk_group": 1,
                "first_k_dense_replace": 1,
                "mlp_layer_types": ["dense"] + ["sparse"] * 7,
                "index_n_heads": 2,
                "index_head_dim": 16,
                "index_topk": 2048,
                "indexer_types": ["full"] * 8,
            },
        ),
    ),
    Family(
        "Glm4MoeLiteForCausalLM",
        ("glm4_moe_lite",),
        ("glm4_moe_lite.py",),
        FIRST_ID_IS_1,
        "plus_one",
        attention="mla",
        tiny=TinyRecipe(
            "Glm4MoeLiteConfig",
            {
                **TINY_MLA,
                "n_routed_experts": 8,
                "n_shared_experts": 1,
                "num_experts_per_tok": 2,
                "moe_intermediate_size": 32,
                "n_group": 1,
                "topk_group": 1,
                "mlp_layer_types": ["dense"] + ["sparse"] * 7,
                "first_k_dense_replace": 1,  # GLM-4.7-Flash's config.json has both; SGLang reads this one
                "moe_layer_freq": 1,
            },
        ),
    ),
    # Block drafters only: SGLang 0.5.23 captures these for DFlash/DSpark, not for EAGLE-3.
    Family("BeamForCausalLM", ("beam",), ("beam.py",), None, "after"),
    Family(
        "LagunaForCausalLM",
        ("laguna",),
        ("laguna.py",),
        None,
        "plus_one",
        attention="gqa",
        tiny=TinyRecipe(
            "LagunaConfig",
            {
                "num_hidden_layers": 8,
                "sliding_window": 8,
                "layer_types": ["full_attention", "sliding_attention"] * 4,
                "num_attention_heads_per_layer": [4] * 8,
                "num_experts": 4,
                "num_experts_per_tok": 2,
                "moe_intermediate_size": 32,
                "shared_expert_intermediate_size": 32,
                "mlp_layer_types": ["dense"] + ["sparse"] * 7,
                "rope_parameters": {
                    "full_attention": {"rope_type": "default", "rope_theta": 500000.0, "partial_rotary_factor": 0.5},
                    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                },
            },
        ),
    ),
    Family(
        "Lfm2ForCausalLM",
        ("lfm2",),
        ("lfm2.py",),
        None,
        "plus_one",
        attention="gqa",
        tiny=TinyRecipe("Lfm2Config", {"num_hidden_layers": 8, "layer_types": LFM2_LAYERS, "full_attn_idxs": None}),
    ),
    Family(
        "Lfm2MoeForCausalLM",
        ("lfm2_moe",),
        ("lfm2_moe.py",),
        None,
        "plus_one",
        attention="gqa",
        tiny=TinyRecipe(
            "Lfm2MoeConfig",
            {
                "num_hidden_layers": 8,
                "layer_types": LFM2_LAYERS,
                "num_dense_layers": 1,
                "num_experts": 4,
                "num_experts_per_tok": 2,
                "moe_intermediate_size": 32,
                # at 0.02 a short-convolution layer moves the residual stream by ~2% only, too close to its
                # neighbour for the capture test to tell an off-by-one layer apart
                "initializer_range": 0.05,
            },
        ),
    ),
    Family("Lfm2VlForConditionalGeneration", ("lfm2_vl",), ("lfm2_vl.py",), None, "plus_one"),
    Family(
        "MiMoV2FlashForCausalLM",
        ("mimo_v2_flash",),
        ("mimo_v2.py",),
        None,
        "plus_one",
        attention="gqa",
        tiny=TinyRecipe(
            "MiMoV2FlashConfig",
            {
                "num_hidden_layers": 8,
                "sliding_window": 8,
                "layer_types": ["full_attention"]
                + ["sliding_attention"] * 3
                + ["full_attention"]
                + ["sliding_attention"] * 3,
                "n_routed_experts": 4,
                "num_experts_per_tok": 2,
                "moe_intermediate_size": 32,
                "mlp_layer_types": ["dense"] + ["sparse"] * 7,
                "v_head_dim": 16,
                "rope_parameters": {
                    "full_attention": {"rope_type": "default", "rope_theta": 5e6, "partial_rotary_factor": 0.5},
                    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
                },
            },
        ),
    ),
    Family("MiniCPMV4_6ForConditionalGeneration", ("minicpmv4_6",), ("minicpmv.py",), None, "plus_one"),
    Family("MiniCPMV4_7ForConditionalGeneration", ("minicpmv4_7",), ("minicpmv.py",), None, "plus_one"),
    Family(
        "NemotronHForCausalLM",
        ("nemotron_h",),
        ("nemotron_h.py",),
        None,
        "plus_one",
        attention="gqa",
        tiny=TinyRecipe(
            "NemotronHConfig",
            {
                "layers_block_type": [
                    "linear_attention",
                    "moe",
                    "linear_attention",
                    "full_attention",
                    "mlp",
                    "linear_attention",
                    "moe",
                    "full_attention",
                ],  # Mamba-2, MoE, attention
                "mamba_num_heads": 4,
                "mamba_head_dim": 16,
                "ssm_state_size": 16,
                "n_groups": 1,
                "chunk_size": 16,
                "n_routed_experts": 4,
                "moe_intermediate_size": 32,
                "moe_shared_expert_intermediate_size": 32,
            },
            {"num_hidden_layers": 8},  # the real config.json has it; transformers' class derives it
        ),
    ),
    Family("NemotronH_Nano_VL_V2", ("NemotronH_Nano_VL_V2",), ("nano_nemotron_vl.py",), None, "plus_one"),
    Family(
        "InklingForConditionalGeneration",
        ("inkling_mm_model",),
        ("inkling.py",),
        None,
        "after",
        tap_when=(("use_sconv", "pre_sconv"),),
    ),
    Family(
        "KimiK3ForConditionalGeneration",
        ("kimi_k3",),
        ("kimi_k3.py",),
        None,
        "after",
        tap_when=(("attn_res_block_size", "attention_residual_mix"),),
    ),
    Family("MuseGlimmerForCausalLM", ("muse_glimmer",), ("muse_glimmer.py",), None, "before"),
    Family("MuseSparkForConditionalGeneration", ("muse_spark",), ("muse_spark.py",), None, "after"),
    Family("NanbeigeForCausalLM", ("nanbeige",), ("nanbeige.py",), None, "plus_one", tap="loop_folded"),
)

#: Files of sglang/srt/models/ that capture but serve no target model a row could name, and why.
NOT_TARGETS: dict[str, str] = {
    "mindspore.py": "MindSporeForCausalLM is chosen by --model-impl mindspore and delegates to the external "
    "sgl_mindspore package: " + TAPS["unknown"],
}


def servable(family: Family) -> bool:
    """SGLang can feed this family's EAGLE-3 draft the residual stream (whatever its config says)."""
    return family.sglang_rule is not None and family.tap == RESIDUAL and not family.tap_when


#: The architectures every stage is tested on: the rows with a tiny recipe that SGLang serves as stored (the table in
#: docs/models.md).
TESTED_ARCHITECTURES: tuple[str, ...] = tuple(f.architecture for f in FAMILIES if f.tiny is not None and servable(f))
#: The rows with a tiny recipe whose tap the pipeline refuses to export: their refusals are tested on it.
REFUSED_ARCHITECTURES: tuple[str, ...] = tuple(
    f.architecture for f in FAMILIES if f.tiny is not None and f.sglang_rule is not None and not servable(f)
)
#: The rows with a tiny recipe that SGLang captures for block drafters only (DFlash, DSpark): every stage is tested
#: on them with a block drafter, and an EAGLE-3 export is refused.
BLOCK_DRAFTER_ARCHITECTURES: tuple[str, ...] = tuple(
    f.architecture for f in FAMILIES if f.tiny is not None and f.sglang_rule is None and f.dflash_rule is not None
)
#: Every row with a tiny recipe: the transformers engine's capture is checked on each.
TINY_ARCHITECTURES: tuple[str, ...] = tuple(f.architecture for f in FAMILIES if f.tiny is not None)
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


def block_drafter_problem(target_cfg: dict[str, Any]) -> str | None:
    """Why SGLang 0.5.23 cannot serve a block drafter (DFlash, DSpark) of this target (its config.json) the states
    this pipeline stores (the residual stream), or None: no DFlash capture for the family, or another tap."""
    model_type = str(target_cfg.get("model_type", ""))
    family = family_of(model_type)
    if family is None or family.dflash_rule is None:
        return (
            f"model_type {model_type!r}: SGLang 0.5.23 has no DFlash capture (set_dflash_layers_to_capture) for this "
            "family in eagle3/target/families.py; a block drafter cannot be served for it. Train train.method eagle3"
        )
    return other_tap_problem(family, target_cfg, "a block drafter")


def other_tap_problem(family: Family, target_cfg: dict[str, Any], draft: str) -> str | None:
    """Why SGLang 0.5.23 cannot feed `draft` ("an EAGLE-3 draft", "a block drafter") of this family's target (its
    config.json) what the store holds: it taps something else than the residual stream; None when it taps that."""
    from eagle3.target.layout import text_config

    tap = family.tap_of(text_config(target_cfg))
    if tap == RESIDUAL:
        return None
    return (
        f"{family.architecture} (model_type {target_cfg.get('model_type', '')!r}): SGLang 0.5.23 feeds {draft} of this "
        f"family {TAPS[tap]} (sglang/srt/models/{', '.join(family.sglang_files)}). This pipeline stores and checks the "
        "residual stream; a draft trained on it and served by SGLang would see other states than it learned from, "
        "and be slower than no draft. Not supported: train this target's draft with the transformers engine and no "
        "export to SGLang, or serve another family"
    )
