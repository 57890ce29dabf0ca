"""What SGLang 0.5.23 and speculators read of an EAGLE-3 / EAGLE-3.1 draft: config.json of each layout and the
weight names. SGLang (sglang/srt/models/llama_eagle3.py) reads `fc_norm` (legacy `use_aux_norm`) and `norm_output`
from the top level of config.json, `fc_norm.{i}.weight` as the per-aux norms, and renames `midlayer.*` to `layers.0.*`.
"""

from __future__ import annotations

from typing import Any

from eagle3.draft.eagle3.model import Eagle3Flags
from eagle3.draft.shape import DraftConfig


def sglang_config(cfg: DraftConfig, layer_ids: list[int], flags: Eagle3Flags) -> dict[str, Any]:
    """config.json of the SGLang draft directory (EAGLE-3.1's two flags at the top level, where SGLang reads them)."""
    return {
        **cfg.llama_config(),
        "fc_norm": flags.fc_norm,
        "norm_output": flags.norm_output,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(layer_ids), "use_aux_hidden_state": True},
    }


def speculators_config(
    cfg: DraftConfig,
    layer_ids: list[int],
    flags: Eagle3Flags,
    *,
    verifier: str,
    verifier_architectures: list[str],
    speculative_tokens: int,
) -> dict[str, Any]:
    """config.json in speculators' Eagle3SpeculatorConfig layout. `norm_before_residual` is false: our (and
    SGLang's) first layer keeps the un-normed hidden state as its residual. speculators' config carries EAGLE-3.1's
    `fc_norm` and `norm_output` (and `norm_before_fc`, a single norm over the concatenation, which we do not use)."""
    layer = {k: v for k, v in cfg.llama_config().items() if k not in ("architectures", "draft_vocab_size",
                                                                       "target_hidden_size")}  # fmt: skip
    layer.update(attention_bias=False, mlp_bias=False)
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "transformer_layer_config": layer,
        "draft_vocab_size": cfg.draft_vocab_size,
        "norm_before_residual": False,
        "norm_before_fc": False,
        "fc_norm": flags.fc_norm,
        "norm_output": flags.norm_output,
        "target_hidden_size": cfg.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": list(layer_ids),
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [
                {
                    "proposal_type": "greedy",
                    "speculative_tokens": speculative_tokens,
                    "accept_tolerance": 0.0,
                    "verifier_accept_k": 1,
                }
            ],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier, "architectures": verifier_architectures},
        },
        "torch_dtype": "bfloat16",
    }


def speculators_key(name: str) -> str:
    """Our (SGLang's) key -> speculators' Eagle3DraftModel key."""
    return "layers.0." + name.removeprefix("midlayer.") if name.startswith("midlayer.") else name
