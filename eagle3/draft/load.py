"""A trained draft back from a trainer checkpoint, for evaluation.

    draft = load_draft(model_dir, "<out>")                        # the newest complete checkpoint
    draft = load_draft(model_dir, "<out>/checkpoints/step-00000200", device=torch.device("cuda"))

The checkpoint's model.safetensors holds everything but the embedding (eagle3/draft/checkpoint.py). Its shapes
give the draft's size: fc.weight is [H, K * H_target], so K aux layers; d2t has one entry per draft id. The
rest (heads, RoPE, norms) comes from the target's config.json, and the frozen embedding from its weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from eagle3.draft.checkpoint import WEIGHTS, CheckpointError, resolve_checkpoint
from eagle3.draft.model import DraftConfig, Eagle3Draft
from eagle3.store.fsio import read_json
from eagle3.target.files import weight_map
from eagle3.target.layout import HEAD_KEYS, LM_PREFIXES, text_config


class TargetWeightsError(ValueError):
    """The target's safetensors lack a tensor the draft needs; names the model directory and the key."""


def load_target_tensors(model_dir: Path, names: dict[str, tuple[str, ...]]) -> dict[str, torch.Tensor]:
    """Tensors of the target model ({alias: candidate keys, first found wins}), reading only those."""
    model_dir = Path(model_dir)
    where = weight_map(model_dir)
    out = {}
    for alias, keys in names.items():
        key = next((k for k in keys if k in where), None)
        if key is None:
            files = sorted({p.name for p in where.values()}) or "no *.safetensors"
            raise TargetWeightsError(
                f"{model_dir}: none of {list(keys)} in {files} (needed for the draft's {alias}); the draft reads "
                f"the target's embedding and lm_head from its weights, so the model directory must hold them"
            )
        with safe_open(str(where[key]), framework="pt") as st:
            out[alias] = st.get_tensor(key)
    return out


def target_head_keys(target_cfg: dict[str, Any]) -> dict[str, tuple[str, ...]]:
    """Candidate keys of the target's embedding and lm_head (tied: the embedding is the head), for
    load_target_tensors: a causal LM's, or a multimodal wrapper's around its language model."""
    embedding = tuple(p + "embed_tokens.weight" for p in LM_PREFIXES)
    text = text_config(target_cfg)
    tied = bool(text.get("tie_word_embeddings", target_cfg.get("tie_word_embeddings", False)))
    return {"embedding": embedding, "lm_head": embedding if tied else HEAD_KEYS}


def load_draft(
    model_dir: Path, checkpoint: Path, *, device: torch.device | None = None, dtype: torch.dtype = torch.float32
) -> Eagle3Draft:
    """The draft of `checkpoint` (a step directory, or a checkpoints root / training out_dir: its latest) for the
    target in `model_dir`, in eval mode. Raises CheckpointError when the weights do not fit the target."""
    path = resolve_checkpoint(checkpoint)
    weights = load_file(str(path / WEIGHTS))
    target_cfg = read_json(Path(model_dir) / "config.json")
    missing = [k for k in ("fc.weight", "d2t", "t2d") if k not in weights]
    if missing:
        raise CheckpointError(f"{path / WEIGHTS}: no {missing}; is it an EAGLE-3 trainer checkpoint?")
    probe = DraftConfig.from_target(target_cfg, num_aux=1, draft_vocab_size=1)
    fused = int(weights["fc.weight"].shape[1])
    if fused % probe.target_hidden_size:
        raise CheckpointError(
            f"{path / WEIGHTS}: fc.weight takes {fused} inputs, not a multiple of the target's hidden size "
            f"{probe.target_hidden_size} ({model_dir}/config.json): a draft of another model"
        )
    cfg = DraftConfig.from_target(
        target_cfg, num_aux=fused // probe.target_hidden_size, draft_vocab_size=int(weights["d2t"].shape[0])
    )
    keys = {"embedding": target_head_keys(target_cfg)["embedding"]}
    embedding = load_target_tensors(Path(model_dir), keys)["embedding"]
    draft = Eagle3Draft(cfg, embedding.to(dtype))
    expected = draft.trainable_state_dict()
    if set(weights) != set(expected):
        raise CheckpointError(
            f"{path / WEIGHTS}: missing {sorted(set(expected) - set(weights))}, "
            f"unexpected {sorted(set(weights) - set(expected))}"
        )
    for key, value in expected.items():
        if value.shape != weights[key].shape:
            raise CheckpointError(
                f"{path / WEIGHTS}: {key} is {tuple(weights[key].shape)}, a draft of {model_dir} has "
                f"{tuple(value.shape)}"
            )
    draft.load_state_dict(weights, strict=False)  # strict=False: the embedding is not in the checkpoint
    return draft.to(device=device, dtype=dtype).eval()
