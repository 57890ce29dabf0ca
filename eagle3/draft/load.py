"""A trained draft back from a trainer checkpoint, for evaluation.

    loaded = load_draft(model_dir, "<out>")                       # the newest complete checkpoint
    loaded = load_draft(model_dir, "<out>/checkpoints/step-00000200", device=torch.device("cuda"))
    loaded.method, loaded.model, loaded.aux_layers, loaded.drafter()   # what it is, and its drafting procedure

state.json names the method (train.method) and the store layers the draft reads; the method builds the module.

The checkpoint's model.safetensors holds everything but the embedding (eagle3/draft/checkpoint.py). Its shapes
give the draft's size: fc.weight is [H, K * H_target], so K aux layers; d2t has one entry per draft id. The
rest (heads, RoPE, norms) comes from the target's config.json, and the frozen embedding from its weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file
from torch import nn

from eagle3.config import TrainConfig
from eagle3.draft.checkpoint import STATE, WEIGHTS, CheckpointError, read_state, resolve_checkpoint
from eagle3.draft.method import Drafter, DraftMethod, MethodError
from eagle3.draft.methods import method_named
from eagle3.draft.shape import DraftConfig
from eagle3.store.fsio import read_json
from eagle3.target.files import weight_map
from eagle3.target.layout import EMBEDDING_NAMES, HEAD_KEYS, LM_PREFIXES, text_config


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
    embedding = tuple(p + name for p in LM_PREFIXES for name in EMBEDDING_NAMES)
    # A wrapper may say it at either level, and transformers ties by the one its class reads (Gemma-4's wrapper:
    # the top level's True over text_config's False): a saved head comes first, else the embedding is the head.
    tied = any(c.get("tie_word_embeddings", False) for c in (text_config(target_cfg), target_cfg))
    return {"embedding": embedding, "lm_head": (*HEAD_KEYS, *embedding) if tied else HEAD_KEYS}


@dataclass(frozen=True)
class LoadedDraft:
    """A trained draft with what it was trained as: its method and the store layers it reads (None: a checkpoint
    written before drafts recorded them, which read all of its store's layers)."""

    method: DraftMethod
    model: nn.Module
    aux_layers: list[int] | None

    def drafter(self) -> Drafter:
        return self.method.drafter(self.model)


def checkpoint_train(path: Path) -> TrainConfig | None:
    """The train settings a checkpoint's state.json records (None: none recorded, or from an older schema)."""
    state = read_state(path) if (path / STATE).is_file() else {}
    try:
        return TrainConfig.model_validate(state["config"])
    except (KeyError, ValueError):
        return None


def checkpoint_method(path: Path) -> tuple[DraftMethod, list[int] | None]:
    """The method and layers a checkpoint's state.json records (before methods: EAGLE-3, layers unrecorded)."""
    state = read_state(path) if (path / STATE).is_file() else {}
    name = state.get("method") or state.get("config", {}).get("method") or "eagle3"
    try:
        method = method_named(str(name))
    except MethodError as e:
        raise CheckpointError(f"{path / STATE}: {e}") from None
    layers = state.get("aux_layers")
    return method, (list(layers) if layers is not None else None)


def load_draft(
    model_dir: Path, checkpoint: Path, *, device: torch.device | None = None, dtype: torch.dtype = torch.float32
) -> LoadedDraft:
    """The draft of `checkpoint` (a step directory, or a checkpoints root / training out_dir: its latest) for the
    target in `model_dir`, in eval mode. Raises CheckpointError when the weights do not fit the target."""
    path = resolve_checkpoint(checkpoint)
    method, aux_layers = checkpoint_method(path)
    weights = load_file(str(path / WEIGHTS))
    target_cfg = read_json(Path(model_dir) / "config.json")
    missing = [k for k in ("fc.weight", "d2t", "t2d") if k not in weights]
    if missing:
        raise CheckpointError(f"{path / WEIGHTS}: no {missing}; is it a draft trainer checkpoint?")
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
    head = load_target_tensors(Path(model_dir), target_head_keys(target_cfg))
    draft = method.build(cfg, head["embedding"].to(dtype), lm_head=head["lm_head"].to(dtype),
                         train=checkpoint_train(path))  # fmt: skip
    expected = draft.trainable_state_dict()  # type: ignore[operator]
    if set(weights) != set(expected):
        raise CheckpointError(
            f"{path / WEIGHTS}: a {method.name} draft has other tensors: missing "
            f"{sorted(set(expected) - set(weights))}, unexpected {sorted(set(weights) - set(expected))}"
        )
    for key, value in expected.items():
        if value.shape != weights[key].shape:
            raise CheckpointError(
                f"{path / WEIGHTS}: {key} is {tuple(weights[key].shape)}, a draft of {model_dir} has "
                f"{tuple(value.shape)}"
            )
    draft.load_state_dict(weights, strict=False)  # strict=False: the embedding is not in the checkpoint
    return LoadedDraft(method, draft.to(device=device, dtype=dtype).eval(), aux_layers)
