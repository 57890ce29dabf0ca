"""A trained draft back from a trainer checkpoint, for evaluation.

    draft = load_draft(model_dir, "<out>")                        # the newest complete checkpoint
    draft = load_draft(model_dir, "<out>/checkpoints/step-00000200", device=torch.device("cuda"))

The checkpoint's model.safetensors holds everything but the embedding (eagle3/draft/checkpoint.py). Its shapes
give the draft's size: fc.weight is [H, K * H_target], so K aux layers; d2t has one entry per draft id. The
rest (heads, RoPE, norms) comes from the target's config.json, and the frozen embedding from its weights.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from eagle3.draft.checkpoint import WEIGHTS, CheckpointError, resolve_checkpoint
from eagle3.draft.model import DraftConfig, Eagle3Draft
from eagle3.fsio import read_json
from eagle3.train.trainer import load_target_tensors

EMBEDDING_KEY = "model.embed_tokens.weight"  # the trainer reads the same key (eagle3/train/trainer.py)


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
    embedding = load_target_tensors(Path(model_dir), {"embedding": EMBEDDING_KEY})["embedding"]
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
