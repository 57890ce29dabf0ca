"""EAGLE-3's training-time-test loss, over the target distribution (eagle3/draft/distill.py).

Alignment (positions within one document of T tokens, x = input ids, loss_mask over tokens):
    target[s]            distribution of x[s+1] given x[..s]       (from last_hidden_state[s])
    step i, position t   predicts x[t+2+i], so its target is target[t+1+i]
    trained when         x[t+2+i] exists, loss_mask[t+2+i] == 1, and the target's argmax at t+1+i is in the
                         draft vocabulary (as SpecForge: a token the draft cannot emit teaches nothing)
    loss of step i       soft cross-entropy summed over trained positions / their count
    total                sum_i decay**i * loss_i
    accuracy of step i   draft argmax (mapped through d2t) == target argmax, over positions with a label
    chain acceptance     1 + the leading correct steps (at most k) at each position where step 0 has a label,
                         the teacher-forced acceptance length of a k-step chain (held-out selection)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from eagle3.draft.distill import DraftLoss, TargetDist, soft_cross_entropy


def ttt_loss(
    logits: list[Tensor],
    target: TargetDist,
    loss_mask: Tensor,
    remaining: Tensor,
    d2t: Tensor,
    decay: float,
    chunk_tokens: int = 4096,
    fused: bool = False,
) -> DraftLoss:
    """logits: steps x [N, Vd]; loss_mask [N]; remaining [N] = tokens after each one in its document.
    `fused`: the soft cross-entropy's compiled chunk functions (train.compile)."""
    n, steps = remaining.shape[0], len(logits)
    idx = torch.arange(n, device=remaining.device)
    mask_ahead = F.pad(loss_mask.bool(), (0, steps + 2))  # [N + steps + 2]
    total = torch.zeros((), dtype=torch.float32, device=remaining.device)
    losses, correct, labelled = [], [], []
    for i, z in enumerate(logits):
        src = (idx + 1 + i).clamp(max=n - 1)  # where target[t+1+i] sits
        label = (remaining >= 2 + i) & mask_ahead[2 + i : 2 + i + n]  # x[t+2+i] exists and is trained on
        w = (label & target.in_draft[src]).float()  # [N]
        loss_i = soft_cross_entropy(z, target.probs, src, w, chunk_tokens, fused) / w.sum().clamp(min=1.0)
        total = total + decay**i * loss_i
        with torch.no_grad():
            pred = z.argmax(-1)  # [N] draft ids
            correct.append((pred + d2t[pred] == target.argmax[src]) & label)
            labelled.append(label)
            losses.append(loss_i.detach())
    hit, lab = torch.stack(correct), torch.stack(labelled)  # [S, N]
    return DraftLoss(
        total=total,
        step_loss=torch.stack(losses),
        step_hits=hit.sum(1).float(),
        step_labels=lab.sum(1).float(),
        correct=hit,
        labelled=lab,
    )

