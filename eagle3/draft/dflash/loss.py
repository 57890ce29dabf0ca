"""DFlash's training objective on one packed row: random anchors, a block of masked positions after each, predicted
in parallel, cross-entropy with DFlash's positional weighting.

Anchors (per row, fixed by the row's content and train.seed, so a resumed run draws the ones it would have): token
positions a with a context (position >= 1 in its document), a next token in the document, and a loss token there.
A row of N tokens gets A = max(1, 2N / B) anchors, drawn without replacement from those positions (padded with
unlabelled copies when there are fewer): each labelled token of a full row is predicted about twice per step, at
different offsets in its blocks, and every step has the same shapes.

Alignment (row positions, x = input ids, target[s] = the target's distribution of x[s+1] given x[..s]):
    block j anchored at a     tokens [x[a], m, .., m] at RoPE positions pos(a)..pos(a)+B-1; context: the features
                              of the rows before a in a's document (all of them: no window)
    output i (1..B-1)         drafts x[a+i]; label: the target's argmax of target[a+i-1] over its whole vocabulary
    trained when              x[a+i] is in the document and loss_mask[a+i] == 1
    loss of position i        cross-entropy over the whole target vocabulary (the draft's logits are norm(h) x the
                              target's lm_head, as SGLang drafts), mean over the trained blocks
    total                     sum_i w_i * loss_i, w_i = exp(-(i-1)/gamma) (DFlash's decay: later positions count
                              less, they are accepted only after every earlier one)

Hard labels, not the soft target distribution: distill.py's TargetDist is over the draft vocabulary, and a DFlash
draft drafts over the whole target vocabulary (SGLang's greedy takes the argmax of the target's lm_head), so a loss
restricted to the draft vocabulary would leave the other logits untrained; the target's argmax is what greedy
verification accepts.

DraftLoss per position s = i - 1, indexed by the anchor's row: correct/labelled [B-1, N] are False off anchors, so
chain_acceptance over them is the teacher-forced acceptance length of a block (1 + leading correct positions).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from eagle3.draft.data import PackedBatch
from eagle3.draft.dflash.model import DFlashDraft
from eagle3.draft.distill import DraftLoss, TargetDist
from eagle3.draft.layers import FLEX_BLOCK, as_block_mask

#: DFlash's decay constant per block size (gamma 7 for blocks of 16, 5 for 10, 4 for 8: the values its public training
#: scripts give; DeepSpec trains DSpark with 4 for 7 drafted tokens, our block_size 8); other sizes
#: interpolate as B / 2.
GAMMA = {16: 7.0, 10: 5.0, 8: 4.0}


def position_weights(block_size: int) -> list[float]:
    """w_i for draft positions i = 1..B-1."""
    gamma = GAMMA.get(block_size, block_size / 2)
    return [math.exp(-(i - 1) / gamma) for i in range(1, block_size)]


def pick_anchors(batch: PackedBatch, block_size: int, seed: int) -> tuple[Tensor, Tensor]:
    """(row indices [A] of the row's anchors, ascending; which of them are real [A] bool), A = max(1, 2N / B) for a
    row of N (padded) tokens, so every step has the same shapes (compile, CUDA graphs); a row with fewer candidates
    pads with copies of its last one (or row 0), whose positions carry no label (see the module docstring)."""
    n = batch.input_ids.shape[0]
    count = max(1, 2 * n // block_size)
    nxt = torch.nn.functional.pad(batch.loss_mask.bool(), (0, 1))[1 : n + 1]  # loss_mask[a+1]
    ok = (batch.positions >= 1) & (batch.remaining >= 1) & nxt
    cand = ok.nonzero().flatten().cpu()
    head = batch.input_ids[:64].cpu()
    g = torch.Generator().manual_seed(seed * 1_000_003 + int((head * torch.arange(1, len(head) + 1)).sum()) + n)
    picked = cand[torch.randperm(len(cand), generator=g)[:count]].sort().values
    real = torch.ones(count, dtype=torch.bool)
    if len(picked) < count:
        real[len(picked) :] = False
        fill = picked[-1:] if len(picked) else torch.zeros(1, dtype=torch.long)
        picked = torch.cat([picked, fill.expand(count - len(picked))])
    dev = batch.input_ids.device
    return picked.to(dev), real.to(dev)


def block_mask(doc: Tensor, anchors: Tensor, block_size: int) -> Tensor:
    """[A*Q, N + A*Q] bool (Q = block_size, the block's query rows): block j's queries see the rows before its anchor
    in its document, and its own block."""
    n, a = doc.shape[0], anchors.shape[0]
    rows = torch.arange(n, device=doc.device)
    ctx = (doc[None, :] == doc[anchors][:, None]) & (rows[None, :] < anchors[:, None])  # [A, N]
    own = torch.eye(a, dtype=torch.bool, device=doc.device)  # [A, A]
    mask = torch.cat([ctx, own], dim=1).repeat_interleave(block_size, dim=0)  # [A*Q, N + A]
    return torch.cat([mask[:, :n], mask[:, n:].repeat_interleave(block_size, dim=1)], dim=1)


def flex_block_mask(doc: Tensor, anchors: Tensor, queries: int) -> Any:
    """block_mask's rule as FlexAttention's BlockMask (CUDA training), its [128 x 128] blocks read from the anchors
    alone: a query block holds the blocks of anchors lo..hi (ascending), so it may see the context rows from
    lo's document start up to hi, and its own blocks' rows. Everything else is skipped, where the dense mask
    computes every score: a 16,384-token row of 100-400-token documents with 2,048 anchors names 0.95% of its
    [256 x 384] blocks."""
    n, a = doc.shape[0], anchors.shape[0]
    m = a * queries
    t = torch.arange(-(-m // FLEX_BLOCK), device=doc.device)
    lo, hi = t * FLEX_BLOCK // queries, ((t * FLEX_BLOCK + FLEX_BLOCK).clamp(max=m) - 1) // queries
    start = torch.searchsorted(doc, doc[anchors[lo]])  # the first row of lo's document (ids never decrease)
    first, last = torch.stack([start, n + lo * queries]), torch.stack([anchors[hi], n + (hi + 1) * queries])
    k = torch.arange(-(-(n + m) // FLEX_BLOCK), device=doc.device) * FLEX_BLOCK
    # key block [k, k + 128) meets the context span [start, anchor_hi) or the own span [n + lo*Q, n + (hi+1)*Q)
    blocks = ((k[None, None, :] < last[:, :, None]) & (k[None, None, :] + FLEX_BLOCK > first[:, :, None])).any(0)

    def block_rule(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        anchor = anchors[q_idx // queries]
        ctx = (doc[kv_idx.clamp(max=n - 1)] == doc[anchor]) & (kv_idx < anchor)
        return torch.where(kv_idx < n, ctx, (kv_idx - n) // queries == q_idx // queries)

    return as_block_mask(blocks, block_rule, m, n + m)


def _terms(
    model: DFlashDraft, rows: Tensor, latent: Tensor | None, labels: Tensor, target_rows: Tensor | None
) -> tuple[Tensor, Tensor, Tensor]:
    """One chunk of drafted positions: (cross-entropy against the target's token [c], the draft's argmax [c], the L1
    distance between the draft's and the target's distributions over the whole vocabulary [c], zeros without
    `target_rows`, the target's final states there)."""
    logits = model.step_logits(rows, latent).float()  # [c, V]
    ce = F.cross_entropy(logits, labels, reduction="none")
    if target_rows is None:
        return ce, logits.argmax(-1), torch.zeros_like(ce)
    with torch.no_grad():
        target = torch.softmax((target_rows.to(model.lm_head.dtype) @ model.lm_head.T).float(), dim=-1)
    return ce, logits.argmax(-1), (torch.softmax(logits, dim=-1) - target).abs().sum(-1)


def block_loss(
    out: Tensor,
    model: DFlashDraft,
    batch: PackedBatch,
    anchors: Tensor,
    real: Tensor,
    target: TargetDist,
    chunk_tokens: int,
) -> DraftLoss:
    """out [A, Q, H] (DFlashDraft.forward) -> DraftLoss over the B - 1 drafted positions: per position i, the draft's
    mix (DFlashDraft.loss_mix: DFlash cross-entropy alone; DSpark DeepSpec's 0.1 x CE + 0.9 x L1 to the target's
    distribution + 1.0 x its confidence head's BCE), weighted by position_weights."""
    n, b = batch.input_ids.shape[0], model.block_size
    s = b - 1
    i = torch.arange(1, b, device=anchors.device)
    rows = anchors[:, None] + i  # [A, S] the row each drafted token sits at
    inside = batch.remaining[anchors][:, None] >= i
    safe = rows.clamp(max=n - 1)
    label = inside & batch.loss_mask.bool()[safe] & real[:, None]  # [A, S]
    labels = target.argmax[safe - 1]  # [A, S] the target's greedy token there
    prev = batch.input_ids[safe - 1]  # [A, S] the token before it (the anchor for the first)
    drafting = model.drafting_rows(out)  # [A, S, H]
    latents = model.step_latents(drafting, prev)  # [A, S, r] (DSpark's Markov head, teacher-forced) or None
    mix = model.loss_mix
    # the target's final state before each drafted token: its distribution there (for the L1 and confidence terms)
    t_rows = batch.last_hidden[safe - 1].reshape(-1, batch.last_hidden.shape[-1]) if mix.needs_target else None
    flat_rows, flat_prev, flat_labels = drafting.reshape(-1, out.shape[-1]), prev.flatten(), labels.flatten()
    flat_latents = None if latents is None else latents.reshape(flat_rows.shape[0], -1)
    parts: list[tuple[Tensor, Tensor, Tensor]] = []
    for a in range(0, flat_rows.shape[0], chunk_tokens):  # [chunk, V] logits at a time, recomputed in backward
        c = slice(a, a + chunk_tokens)
        lat = None if flat_latents is None else flat_latents[c]
        trow = None if t_rows is None else t_rows[c]
        parts.append(checkpoint(_terms, model, flat_rows[c], lat, flat_labels[c], trow, use_reentrant=False))
    if parts:
        ce, pred, l1 = (torch.cat(t).view(-1, s) for t in zip(*parts, strict=True))
    else:
        ce = l1 = out.new_zeros(0, s, dtype=torch.float32)
        pred = labels
    hit = (pred == labels) & label  # [A, S]
    accept = (1.0 - 0.5 * l1.detach()).clamp(0.0, 1.0)  # the sampled acceptance rate: 1 - total variation
    side = model.side_loss(flat_rows, flat_prev, accept.flatten()).view(-1, s)
    w = label.float()

    def per_position(x: Tensor) -> Tensor:
        return (x * w).sum(0) / w.sum(0).clamp(min=1.0)  # [S]

    per_pos = per_position(ce)
    mixed = mix.ce * per_pos + mix.l1 * per_position(l1) + mix.confidence * per_position(side)
    weights = torch.tensor(position_weights(b), device=out.device)
    total = (weights * mixed).sum()
    correct = torch.zeros(s, n, dtype=torch.bool, device=out.device)
    labelled = torch.zeros(s, n, dtype=torch.bool, device=out.device)
    correct[:, anchors[real]], labelled[:, anchors[real]] = hit[real].T, label[real].T
    return DraftLoss(
        total=total,
        step_loss=per_pos.detach(),
        step_hits=hit.sum(0).float(),
        step_labels=label.sum(0).float(),
        correct=correct,
        labelled=labelled,
    )
