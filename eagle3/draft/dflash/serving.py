"""What SGLang 0.5.23 reads of a DFlash draft: config.json and the layer ids (sglang/srt/models/dflash.py,
sglang/srt/speculative/dflash_utils.py parse_dflash_draft_config, dflash_worker_v2.py).

config.json
    architectures           ["DFlashDraftModel"] (SGLang's EntryClass; DFlash2/Domino/Laguna are other classes)
    model_type              "qwen3": the draft's attention is Qwen3's (q_norm, k_norm); only the HF config class
                            SGLang builds from it depends on it
    num_hidden_layers       the draft's layers (>= 1)
    hidden_size, heads, head_dim, intermediate_size, rms_norm_eps, RoPE, vocab_size   the draft's shape
    dflash_config           block_size (--speculative-num-draft-tokens overrides it, with a warning),
                            mask_token_id (must be < the target's vocab_size; set, so no tokenizer lookup or
                            added token), target_layer_ids (0-based target layers; see below)
    no layer_types          every draft layer attends without a causal mask inside the block (ENCODER_ONLY)

Weights: fc.weight [H, K*H], hidden_norm.weight, layers.{i}.self_attn.{q,k,v,o}_proj.weight and {q,k}_norm.weight,
layers.{i}.{input_layernorm,post_attention_layernorm}.weight, layers.{i}.mlp.{gate,up,down}_proj.weight (SGLang
stacks q/k/v into qkv_proj and gate/up into gate_up_proj), norm.weight. No embed_tokens, no lm_head: the worker
borrows the target's. SGLang's load_weights skips any other name silently (our d2t, t2d: the trainer's vocab map).

Target layer ids: "hidden states after each selected target layer (HF-style)": id k is the output of layer k, HF
hidden_states[k + 1], for the families whose set_dflash_layers_to_capture adds 1 (or captures after the layer);
Muse Glimmer's captures before layer k (HF index k). eagle3/target/families.py's `dflash_rule` says which.
SGLang's own default (no target_layer_ids) is build_target_layer_ids(N, draft layers): the draft's layer count of
ids spread over 1..N-3; ours are written explicitly, so the store's layers are the ones served.
"""

from __future__ import annotations

from typing import Any

from eagle3.draft.method import MethodError
from eagle3.draft.shape import DraftConfig
from eagle3.target.families import DFlashRule, block_drafter_problem, family_of


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """SGLang 0.5.23's dflash_utils.build_target_layer_ids (its rounding included): 0-based target layers."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    if end < start:
        raise MethodError(f"DFlash's layer selection needs a target of >= 4 layers, not {num_target_layers}")
    span = end - start
    return [round(start + (i * span) / (num_draft_layers - 1)) for i in range(num_draft_layers)]


def hf_index(layer_id: int, rule: DFlashRule) -> int:
    """A target_layer_id -> the HF hidden_states index SGLang captures for it."""
    return layer_id if rule == "before" else layer_id + 1


def dflash_rule_of(model_type: str) -> DFlashRule:
    family = family_of(model_type)
    if family is None or family.dflash_rule is None:
        raise MethodError(str(block_drafter_problem({"model_type": model_type})))
    return family.dflash_rule


def target_layer_ids(aux_layers: list[int], model_type: str) -> list[int]:
    """HF hidden_states indices -> dflash_config.target_layer_ids for this family."""
    rule = dflash_rule_of(model_type)
    return [x if rule == "before" else x - 1 for x in aux_layers]


def sglang_config(
    cfg: DraftConfig, *, num_layers: int, block_size: int, mask_token_id: int, layer_ids: list[int]
) -> dict[str, Any]:
    """config.json of the SGLang DFlash draft directory; `layer_ids`: dflash_config.target_layer_ids."""
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "num_hidden_layers": num_layers,
        "hidden_act": "silu",
        "attention_bias": False,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": cfg.rope_scaling,
        "max_position_embeddings": cfg.max_position_embeddings,
        "vocab_size": cfg.vocab_size,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "block_size": block_size,
        "dflash_config": {
            "block_size": block_size,
            "mask_token_id": mask_token_id,
            "target_layer_ids": list(layer_ids),
        },
    }
