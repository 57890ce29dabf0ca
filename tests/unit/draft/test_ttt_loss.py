"""Targets and loss of the training-time test: chunking, the soft cross-entropy, alignment, accuracy."""

from __future__ import annotations

import contextlib

import pytest
import torch

from eagle3.config import TrainConfig
from eagle3.draft.data import PackedBatch
from eagle3.draft.distill import (
    TargetDist,
    draft_to_target_ids,
    labelled_rows,
    soft_cross_entropy,
    target_distribution,
)
from eagle3.draft.eagle3.loss import ttt_loss
from eagle3.draft.layers import dense_attend
from eagle3.draft.methods import method_named
from eagle3.draft.shape import DraftConfig
from eagle3.draft.synthetic import SyntheticSpec, target_config


def vocab_map(vocab: int, draft: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randperm(vocab, generator=g)[:draft]  # any order: draft index i -> target id ids[i]
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[ids] = True
    return ids - torch.arange(draft), t2d


def test_chunked_target_distribution_equals_the_unchunked_one() -> None:
    torch.manual_seed(0)
    n, h, v, vd = 37, 16, 300, 50
    d2t, t2d = vocab_map(v, vd)
    # float64 logits: a chunk's matmul may sum in another order than the whole batch's, which in float32 moves
    # the last bits (seen: 1.6e-6 relative under load); the chunking itself must change nothing.
    last, head = torch.randn(n, h, dtype=torch.float64), torch.randn(v, h, dtype=torch.float64)
    full = last @ head.T  # [N, V]: the whole batch at once, the reference only
    ref = torch.softmax(full[:, draft_to_target_ids(d2t)].float(), -1)
    for chunk in (1, 8, 37, 64):
        got = target_distribution(last, head, d2t, t2d, chunk)
        torch.testing.assert_close(got.probs, ref, rtol=1e-6, atol=1e-7)
        assert torch.equal(got.argmax, full.argmax(-1))
        assert torch.equal(got.in_draft, t2d[full.argmax(-1)])
        rows = torch.rand(n, generator=torch.Generator().manual_seed(chunk)) > 0.4  # only these are computed
        part = target_distribution(last, head, d2t, t2d, chunk, rows)
        torch.testing.assert_close(part.probs[rows], ref[rows], rtol=1e-6, atol=1e-7)
        assert torch.equal(part.argmax[rows], full.argmax(-1)[rows])
        assert torch.equal(part.in_draft, t2d[full.argmax(-1)] & rows)
        assert not part.probs[~rows].any() and not part.argmax[~rows].any()


def _method_batch(lengths: list[int], prompts: list[int], pad: int, vocab: int, hidden: int) -> PackedBatch:
    """A packed row as the store gives it: each document's first `prompts[d]` tokens untrained, then padding."""
    g = torch.Generator().manual_seed(2)
    n = sum(lengths) + pad
    loss_mask = torch.cat([torch.arange(m) >= p for m, p in zip(lengths, prompts, strict=True)] + [torch.zeros(pad)])
    cat = torch.cat
    return PackedBatch(
        input_ids=torch.randint(vocab, (n,), generator=g), loss_mask=loss_mask.to(torch.uint8),
        aux_hidden=torch.randn(n, 3, hidden, generator=g), last_hidden=torch.randn(n, hidden, generator=g),
        positions=cat([torch.arange(m) for m in lengths] + [torch.zeros(pad, dtype=torch.int64)]),
        remaining=cat([torch.arange(m - 1, -1, -1) for m in lengths] + [torch.zeros(pad, dtype=torch.int64)]),
        doc=cat([torch.full((m,), d) for d, m in enumerate(lengths)] + [torch.full((pad,), len(lengths))]).int(),
        num_tokens=sum(lengths),
    )  # fmt: skip


@pytest.mark.parametrize("method", ["eagle3", "eagle3.1", "dflash", "dspark"])
def test_the_target_over_the_labelled_rows_only_gives_every_method_the_same_loss_gradient_and_hits(
    method: str,
) -> None:
    """The trainer computes the target head only where a loss reads it (labelled_rows: x[s+1] trained, in the
    document): each method's loss, per-position losses, hits, labels and gradients equal those from the target over
    every row, on a row with untrained prompts and padding. The draft vocabulary is 2 ids whose target head rows are
    scaled up, so most labels are in it and the drafts hit some (the hits are compared, not vacuous)."""
    m = method_named(method)
    train = TrainConfig(method=method, block_size=4, markov_rank=8, ttt_steps=3)  # type: ignore[arg-type]
    cfg = DraftConfig.from_target(target_config(SyntheticSpec()), num_aux=3, draft_vocab_size=2)
    torch.manual_seed(0)
    ids = torch.randperm(cfg.vocab_size)[: cfg.draft_vocab_size].sort().values
    lm_head = torch.randn(cfg.vocab_size, cfg.hidden_size)
    lm_head[ids] *= 3
    model = m.build(cfg, torch.randn(cfg.vocab_size, cfg.hidden_size), lm_head=lm_head, train=train)
    t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    t2d[ids] = True
    d2t = ids - torch.arange(len(ids))
    model.set_vocab_map(d2t, t2d)  # type: ignore[operator]
    batch = _method_batch([19, 7, 26, 12], [5, 3, 9, 12], 8, cfg.vocab_size, cfg.hidden_size)
    rows = labelled_rows(batch.loss_mask, batch.remaining)
    assert 0 < int(rows.sum()) < len(rows)
    runs = []
    for only in (None, rows):
        model.zero_grad()
        target = target_distribution(batch.last_hidden, lm_head, d2t, t2d, 16, only)
        out = m.loss(model, model, batch, target, train, dense_attend(batch.doc), contextlib.nullcontext, False)
        out.total.backward()
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        runs.append((out, grads))
    (full, g_full), (part, g_part) = runs
    assert float(full.step_hits.sum()) > 0 and not bool(target.in_draft[rows].all())  # hits, and labels outside
    torch.testing.assert_close(part.total, full.total, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(part.step_loss, full.step_loss, rtol=1e-5, atol=1e-6)
    for a, b in ((part.step_hits, full.step_hits), (part.step_labels, full.step_labels),
                 (part.correct, full.correct), (part.labelled, full.labelled)):  # fmt: skip
        assert torch.equal(a, b)
    assert len(g_part) == len(g_full) > 0
    for a, b in zip(g_part, g_full, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_soft_cross_entropy_value_and_gradient_match_the_plain_formula() -> None:
    torch.manual_seed(0)
    n, m, vd = 11, 14, 23
    logits = torch.randn(n, vd, dtype=torch.float64, requires_grad=True)
    probs = torch.softmax(torch.randn(m, vd, dtype=torch.float64), -1)
    src = torch.randint(0, m, (n,))
    w = (torch.rand(n) > 0.3).double()
    got = soft_cross_entropy(logits, probs, src, w, chunk=4)
    ref_logits = logits.detach().clone().requires_grad_(True)
    ref = -(w[:, None] * probs[src] * torch.log_softmax(ref_logits, -1)).sum()
    got.backward()
    ref.backward()
    torch.testing.assert_close(got, ref)
    torch.testing.assert_close(logits.grad, ref_logits.grad)


@pytest.mark.slow  # compiles two small kernels with inductor (C++ on the CPU): ~20 s
def test_the_fused_soft_cross_entropy_gives_the_eager_value_and_gradient() -> None:
    """train.compile's path (compiled chunk functions) against the eager one, bf16 logits as the trainer has them,
    with a short last chunk (a second shape)."""
    torch.manual_seed(0)
    n, m, vd = 37, 40, 50
    probs = torch.softmax(torch.randn(m, vd), -1)
    src = torch.randint(0, m, (n,))
    w = (torch.rand(n) > 0.3).float()
    runs = []
    for fused in (False, True):
        logits = (3 * torch.randn(n, vd, generator=torch.Generator().manual_seed(1))).bfloat16().requires_grad_(True)
        loss = soft_cross_entropy(logits, probs, src, w, chunk=16, fused=fused)
        loss.backward()
        assert logits.grad is not None and logits.grad.dtype == torch.bfloat16
        runs.append((loss.detach(), logits.grad.float()))
    (eager, g_eager), (fused_loss, g_fused) = runs
    torch.testing.assert_close(fused_loss, eager, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(g_fused, g_eager, rtol=1e-2, atol=1e-3)  # bf16 rounding of the gradient


def reference_loss(
    logits: list[torch.Tensor],
    probs: torch.Tensor,
    argmax: torch.Tensor,
    t2d: torch.Tensor,
    lengths: list[int],
    loss_mask: torch.Tensor,
    decay: float,
) -> tuple[float, list[float]]:
    """Document by document, position by position, straight from the alignment rule in loss.py's docstring."""
    total, per_step = 0.0, []
    for i, z in enumerate(logits):
        ce_sum, count, start = 0.0, 0, 0
        for t_len in lengths:
            for t in range(t_len):
                n = start + t
                if t + 2 + i <= t_len - 1 and loss_mask[n + 2 + i] and t2d[argmax[n + 1 + i]]:
                    ce_sum += float(-(probs[n + 1 + i] * torch.log_softmax(z[n], -1)).sum())
                    count += 1
            start += t_len
        per_step.append(ce_sum / max(count, 1))
        total += decay**i * per_step[-1]
    return total, per_step


def test_ttt_loss_pairs_step_i_at_t_with_target_t_plus_1_plus_i_within_the_document_and_the_loss_mask() -> None:
    torch.manual_seed(0)
    lengths, vocab, vd, steps = [9, 5, 12, 3], 60, 25, 4
    n = sum(lengths) + 3  # + padding to the row size
    d2t, t2d = vocab_map(vocab, vd)
    remaining = torch.cat([torch.arange(t - 1, -1, -1) for t in lengths] + [torch.zeros(3, dtype=torch.int64)])
    loss_mask = (torch.rand(n) > 0.3).to(torch.uint8)
    target = TargetDist(
        probs=torch.softmax(torch.randn(n, vd), -1),
        argmax=torch.randint(0, vocab, (n,)),
        in_draft=torch.zeros(n, dtype=torch.bool),
    )
    target.in_draft = t2d[target.argmax]
    logits = [torch.randn(n, vd) for _ in range(steps)]
    out = ttt_loss(logits, target, loss_mask, remaining, d2t, decay=0.8, chunk_tokens=5)
    total, per_step = reference_loss(logits, target.probs, target.argmax, t2d, lengths, loss_mask, 0.8)
    torch.testing.assert_close(out.step_loss, torch.tensor(per_step), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.total, torch.tensor(total), rtol=1e-5, atol=1e-6)


def test_accuracy_maps_the_drafts_argmax_through_d2t_and_counts_non_draft_targets_as_misses() -> None:
    vocab, vd = 10, 4
    d2t, t2d = vocab_map(vocab, vd, seed=3)
    ids = draft_to_target_ids(d2t)
    outside = int((~t2d).nonzero()[0])
    n = 6  # one document; step 0 has labels at t = 0..3 (target at 1..4)
    argmax = torch.tensor([0, int(ids[2]), int(ids[0]), outside, int(ids[3]), 0])
    target = TargetDist(probs=torch.full((n, vd), 1 / vd), argmax=argmax, in_draft=t2d[argmax])
    logits = torch.full((n, vd), -5.0)
    logits[0, 2] = logits[1, 0] = logits[2, 1] = logits[3, 3] = 5.0  # right, right, (outside: miss), right
    out = ttt_loss([logits], target, torch.ones(n, dtype=torch.uint8), torch.arange(n - 1, -1, -1), d2t, 0.8)
    assert out.step_labels.tolist() == [4.0]
    assert out.step_hits.tolist() == [3.0]
