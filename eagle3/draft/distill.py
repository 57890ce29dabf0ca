"""What every draft method distils from: the target's distribution over the draft vocabulary, a chunked soft
cross-entropy against it, and the per-position result a method's loss returns (DraftLoss) with the teacher-forced
acceptance length the held-out slice reports.

Target distribution (once per batch): the stored final post-norm state x the target's frozen lm_head, restricted to
the draft vocabulary and renormalized there (softmax over the draft ids' logits, from the draft ids' rows of the head
alone). Only the rows some loss reads are computed (labelled_rows: row s is the distribution of x[s+1], a label only
where x[s+1] is trained); prompt tokens and padding cost nothing. It goes in chunks of tokens, so at most
[chunk, target vocab] logits exist at once; the full-vocab logits are needed only for the target's argmax (is it in
the draft vocabulary? the EAGLE-3 loss skips a row whose argmax is not, and accuracy; DFlash's hard label).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import torch
from torch import Tensor


@dataclass
class TargetDist:
    probs: Tensor  # [N, Vd] fp32: softmax of the target logits over the draft vocabulary
    argmax: Tensor  # [N] int64: target id of the target's argmax over its whole vocabulary
    in_draft: Tensor  # [N] bool: that argmax is in the draft vocabulary


def draft_to_target_ids(d2t: Tensor) -> Tensor:
    """Target id of each draft id: i + d2t[i]. [Vd] int64."""
    return torch.arange(len(d2t), device=d2t.device) + d2t


def labelled_rows(loss_mask: Tensor, remaining: Tensor) -> Tensor:
    """[N] bool: the rows whose target distribution (that of x[s+1]) is a label, x[s+1] being in row s's document
    and trained (loss_mask[s+1]); every method's loss reads the target there only."""
    return torch.nn.functional.pad(loss_mask.bool(), (0, 1))[1:] & (remaining >= 1)


@torch.no_grad()
def target_distribution(
    last_hidden: Tensor, lm_head: Tensor, d2t: Tensor, t2d: Tensor, chunk_tokens: int, rows: Tensor | None = None
) -> TargetDist:
    """last_hidden [N, H], lm_head [V, H] (the target's, frozen) -> TargetDist, chunk_tokens rows at a time. `rows`
    [N] bool (labelled_rows): only those are computed; the others hold probs 0, argmax 0, in_draft False."""
    ids = draft_to_target_ids(d2t)  # [Vd]
    n, dev = last_hidden.shape[0], last_hidden.device
    probs = torch.zeros(n, len(ids), dtype=torch.float32, device=dev)
    argmax = torch.zeros(n, dtype=torch.int64, device=dev)
    at = torch.arange(n, device=dev) if rows is None else rows.nonzero().squeeze(1)
    draft_head = lm_head[ids]  # [Vd, H]: the soft target needs the draft ids' logits only
    for a in range(0, len(at), chunk_tokens):
        r = at[a : a + chunk_tokens]
        h = last_hidden[r].to(lm_head.dtype)  # [c, H]
        probs[r] = torch.softmax((h @ draft_head.T).float(), dim=-1)  # [c, Vd]
        argmax[r] = (h @ lm_head.T).argmax(-1)  # [c, V] logits, one chunk only
    in_draft = t2d[argmax] if rows is None else t2d[argmax] & rows
    return TargetDist(probs=probs, argmax=argmax, in_draft=in_draft)


def _ce_chunk(z: Tensor, probs: Tensor, src: Tensor, w: Tensor) -> Tensor:
    """sum_n w[n] * CE(probs[src[n]], softmax(z[n])) over one chunk: z [c, Vd] (bf16 or fp32), src [c], w [c]."""
    z, p = z.float(), probs[src]
    return ((torch.logsumexp(z, dim=-1) * p.sum(-1) - (p * z).sum(-1)) * w).sum()


def _ce_chunk_grad(z: Tensor, probs: Tensor, src: Tensor, wg: Tensor) -> Tensor:
    """d/dz of _ce_chunk times the upstream gradient (wg = w * grad), in z's dtype."""
    zf, p = z.float(), probs[src]
    return ((torch.softmax(zf, dim=-1) * p.sum(-1, keepdim=True) - p) * wg[:, None]).to(z.dtype)


ChunkFn = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


@functools.cache
def _compiled() -> tuple[ChunkFn, ChunkFn]:
    """The two chunk functions compiled (on first use): a fused kernel or two per pass instead of about ten full
    passes over [chunk, Vd] fp32 (cast, gather, logsumexp, products, sums; softmax, products, cast), which took
    about 15% of an 8B-shaped draft's step eagerly (docs/performance.md)."""
    return cast(ChunkFn, torch.compile(_ce_chunk)), cast(ChunkFn, torch.compile(_ce_chunk_grad))


def _chunk_fns(fused: bool) -> tuple[ChunkFn, ChunkFn]:
    return _compiled() if fused else (_ce_chunk, _ce_chunk_grad)


class _SoftCrossEntropy(torch.autograd.Function):
    """sum_n w[n] * CE(probs[src[n]], softmax(logits[n])), chunked; saves the logits, not their fp32 softmax."""

    @staticmethod
    def forward(ctx, logits: Tensor, probs: Tensor, src: Tensor, weight: Tensor, chunk: int, fused: bool) -> Tensor:  # type: ignore[override]
        fwd, _ = _chunk_fns(fused)
        total = torch.zeros((), dtype=torch.float32, device=logits.device)
        for a in range(0, logits.shape[0], chunk):
            b = a + chunk
            total = total + fwd(logits[a:b], probs, src[a:b], weight[a:b])
        ctx.save_for_backward(logits, probs, src, weight)
        ctx.chunk, ctx.fused = chunk, fused
        return total

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        logits, probs, src, weight = ctx.saved_tensors
        _, bwd = _chunk_fns(ctx.fused)
        out = torch.empty_like(logits)
        for a in range(0, logits.shape[0], ctx.chunk):
            b = a + ctx.chunk
            out[a:b] = bwd(logits[a:b], probs, src[a:b], weight[a:b] * grad)
        return out, None, None, None, None, None


def soft_cross_entropy(
    logits: Tensor, probs: Tensor, src: Tensor, weight: Tensor, chunk: int = 4096, fused: bool = False
) -> Tensor:
    """`fused`: the compiled chunk functions (same values to float rounding; tests/unit/draft/test_ttt_loss.py)."""
    return _SoftCrossEntropy.apply(logits, probs, src, weight, chunk, fused)  # type: ignore[no-any-return]

@dataclass
class DraftLoss:
    """A method's loss on one packed batch, per draft position s (EAGLE-3: TTT step s; a block drafter: the s-th
    token of the block), so the trainer, its metrics and the held-out slice read every method the same way."""

    total: Tensor  # scalar, differentiable: the method's weighted sum over positions
    step_loss: Tensor  # [S] detached
    step_hits: Tensor  # [S] tokens where the draft's argmax equals the target's
    step_labels: Tensor  # [S] tokens with a label (accuracy denominator)
    correct: Tensor  # [S, N] bool: position s drafted from token t has a label and the draft's argmax is the target's
    labelled: Tensor  # [S, N] bool: position s drafted from token t has a label

@torch.no_grad()
def chain_acceptance(out: DraftLoss, k: int) -> tuple[Tensor, Tensor]:
    """Teacher-forced acceptance of a k-step draft chain: over the positions where step 0 has a label, the sum of
    1 + the number of consecutive correct steps from step 0 (at most k), and the count of those positions. A
    step without a label (the document or its loss mask ends) ends the chain. Returns (sum, count), fp64 scalars."""
    run = torch.cumprod(out.correct[:k].to(torch.int64), dim=0).sum(0)  # [N] leading correct steps
    start = out.labelled[0]
    return (1 + run)[start].sum().double(), start.sum().double()
