"""Warm start: a new training's draft initialised from an exported draft (the store's `draft/current`).

    warm_start(model, export_dir) -> WarmStart

The export holds the trainable weights in the trainer's own key names (eagle3/release/export.py) plus its
vocabulary map.
The new training's vocabulary map may differ (convert recounts tokens on the grown store): lm_head rows are
matched by target token id (draft id i is target id i + d2t[i]); a draft id the old draft did not have keeps its
fresh initialisation. Every other weight must have the same shape (same target, same aux layers), else the
message names the key.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from eagle3.draft.checkpoint import WEIGHTS
from eagle3.draft.method import DraftModule


class WarmStartError(ValueError):
    """The export cannot initialise this draft; the message names the file, the key and the fix."""


@dataclass(frozen=True)
class WarmStart:
    export_dir: str
    copied: int  # tensors copied whole
    lm_head_rows: int  # draft ids whose lm_head row came from the export
    draft_vocab: int


@torch.no_grad()
def warm_start(model: DraftModule, export_dir: Path) -> WarmStart:
    path = Path(export_dir) / WEIGHTS
    if not path.is_file():
        raise WarmStartError(f"{path}: no exported weights; train.init=previous needs an exported draft")
    old = load_file(str(path))
    mine = model.trainable_state_dict()
    missing = sorted(set(mine) - set(old))
    if missing:
        raise WarmStartError(f"{path}: no {missing}; set train.init=fresh or export the draft again")
    copied = 0
    for key, value in mine.items():
        if key in ("lm_head.weight", "d2t", "t2d"):  # the vocabulary map is this training's (convert)
            continue
        if old[key].shape != value.shape:
            raise WarmStartError(
                f"{path}: {key} is {tuple(old[key].shape)}, this draft's is {tuple(value.shape)} (another target or "
                "aux layers); set train.init=fresh"
            )
        value.copy_(old[key].to(value.dtype))
        copied += 1
    # lm_head: by target token id
    vocab = model.t2d.numel()
    old_d2t = old["d2t"].to(torch.int64)
    old_targets = torch.arange(len(old_d2t)) + old_d2t  # [old draft vocab] target ids
    row_of = torch.full((vocab,), -1, dtype=torch.int64)
    row_of[old_targets] = torch.arange(len(old_d2t))
    new_d2t = model.d2t.cpu()
    rows = row_of[torch.arange(len(new_d2t)) + new_d2t]  # [draft vocab] old row or -1
    keep = rows >= 0
    head = mine["lm_head.weight"]  # [draft vocab, H]
    if old["lm_head.weight"].shape[1] != head.shape[1]:
        raise WarmStartError(f"{path}: lm_head.weight has width {old['lm_head.weight'].shape[1]}, not {head.shape[1]}")
    head[keep.to(head.device)] = old["lm_head.weight"][rows[keep]].to(head.device, head.dtype)
    return WarmStart(str(export_dir), copied, int(keep.sum()), len(new_d2t))
