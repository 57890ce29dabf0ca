"""The block drafters' draft, mask and layer choice on tiny random drafts (eagle3/draft/dflash/, dspark/)."""

from __future__ import annotations

import pytest
import torch

from eagle3.config import TrainConfig
from eagle3.draft.data import PackedBatch
from eagle3.draft.dflash import METHOD, default_layers
from eagle3.draft.dflash.drafter import BlockDrafter
from eagle3.draft.dflash.loss import block_mask, flex_block_mask, pick_anchors, position_weights
from eagle3.draft.dflash.model import DFlashDraft
from eagle3.draft.dflash.serving import build_target_layer_ids, target_layer_ids
from eagle3.draft.dspark.model import DSparkDraft
from eagle3.draft.method import MethodError
from eagle3.draft.methods import method_named
from eagle3.draft.shape import DraftConfig, DraftConfigError
from eagle3.draft.synthetic import SyntheticSpec, target_config

K, B = 3, 4


def draft(method: str = "dflash", block_size: int = B, markov_head: str = "vanilla") -> DFlashDraft:
    cfg = DraftConfig.from_target(target_config(SyntheticSpec()), num_aux=K, draft_vocab_size=96)
    torch.manual_seed(0)
    train = TrainConfig(method=method, block_size=block_size, markov_rank=8, markov_head=markov_head)  # type: ignore[arg-type]
    lm_head = torch.randn(cfg.vocab_size, cfg.hidden_size)
    model = method_named(method).build(cfg, torch.randn(cfg.vocab_size, cfg.hidden_size), lm_head=lm_head,
                                       train=train)  # fmt: skip
    assert isinstance(model, DFlashDraft)
    return model.eval()


def packed_row(lengths: list[int], vocab: int, hidden: int) -> PackedBatch:
    """One packed row of documents of `lengths`, every token a loss token, random ids and aux states."""
    g = torch.Generator().manual_seed(1)
    n = sum(lengths)
    doc = torch.cat([torch.full((m,), i, dtype=torch.int32) for i, m in enumerate(lengths)])
    positions = torch.cat([torch.arange(m) for m in lengths])
    remaining = torch.cat([torch.arange(m - 1, -1, -1) for m in lengths])
    return PackedBatch(input_ids=torch.randint(vocab, (n,), generator=g), loss_mask=torch.ones(n, dtype=torch.uint8),
                       aux_hidden=torch.randn(n, K, hidden, generator=g), last_hidden=torch.zeros(n, hidden),
                       positions=positions, remaining=remaining, doc=doc, num_tokens=n)  # fmt: skip


@pytest.mark.parametrize("method", ["dflash", "dspark"])
def test_the_block_forward_equals_each_block_drafted_alone_with_a_hand_built_mask(method: str) -> None:
    """All anchors of a packed row of two documents in one forward (block_mask) against each block run alone over
    its document's rows before the anchor with an all-visible mask, and against the offline drafter after it
    committed the same prefix: equal position by position."""
    model = draft(method)
    q = model.queries  # DFlash: B rows, DSpark: B - 1
    batch = packed_row([11, 9], model.cfg.vocab_size, model.cfg.hidden_size)
    anchors, real = pick_anchors(batch, B, seed=0)
    assert len(anchors) == 2 * 20 // B and bool(real.all()) and set(batch.doc[anchors].tolist()) == {0, 1}
    with torch.no_grad():
        together = model(batch.aux_hidden, batch.positions, batch.input_ids[anchors], batch.positions[anchors],
                         block_mask(batch.doc, anchors, q))  # fmt: skip  # [A, Q, H]
        for j, a in enumerate(anchors.tolist()):
            start = a - int(batch.positions[a])  # the document's first row
            ctx = model.context_kv(model.context(batch.aux_hidden[start:a]), batch.positions[start:a])
            pos = batch.positions[a] + torch.arange(q)
            alone = model.blocks(model.block_input(batch.input_ids[a : a + 1]).flatten(), pos, ctx,
                                 torch.ones(q, a - start + q, dtype=torch.bool))  # fmt: skip
            torch.testing.assert_close(together[j], alone, rtol=1e-5, atol=1e-5)

            drafter = BlockDrafter(model)  # the offline drafter, after the target verified x[start..a]
            drafter.start(batch.input_ids[start : a + 1].tolist(), batch.aux_hidden[start:a])
            torch.testing.assert_close(drafter.rows(), model.drafting_rows(alone), rtol=1e-5, atol=1e-5)


def test_a_block_never_sees_another_document_or_rows_at_or_after_its_anchor() -> None:
    doc = torch.tensor([0, 0, 0, 1, 1, 1, 1])
    mask = block_mask(doc, torch.tensor([1, 5]), 2)  # [4, 7 + 4]
    assert mask[:2, :7].tolist() == [[True, False, False, False, False, False, False]] * 2
    assert mask[2:, :7].tolist() == [[False, False, False, True, True, False, False]] * 2
    assert mask[:2, 7:].tolist() == [[True, True, False, False]] * 2
    assert mask[2:, 7:].tolist() == [[False, False, True, True]] * 2


def test_anchors_have_a_context_and_a_next_token_are_the_same_for_the_same_row_and_fill_a_fixed_count() -> None:
    batch = packed_row([6, 5], 128, 32)
    a, real = pick_anchors(batch, 4, seed=3)
    assert torch.equal(a, pick_anchors(batch, 4, seed=3)[0]) and len(a) == 2 * 11 // 4 and bool(real.all())
    assert all(int(batch.positions[x]) >= 1 and int(batch.remaining[x]) >= 1 for x in a)
    few, real = pick_anchors(batch, 2, seed=3)  # 11 anchors wanted, 7 positions qualify (positions 1.. with a next)
    assert len(few) == 11 and real.tolist() == [True] * 7 + [False] * 4 and len(set(few[:7].tolist())) == 7
    assert position_weights(16)[0] == 1.0 and position_weights(16)[7] == pytest.approx(torch.exp(torch.tensor(-1.0)))


def test_default_layers_are_sglangs_build_target_layer_ids_as_hf_indices() -> None:
    # the published Qwen3-8B DFlash draft's ids (36 layers) and SGLang's rounding (round half to even: 30 layers)
    assert build_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert build_target_layer_ids(30, 5) == [1, 8, 14, 20, 27]
    assert default_layers(8) == [2, 3, 4, 5, 6]
    assert target_layer_ids([2, 3, 4, 5, 6], "llama") == [1, 2, 3, 4, 5]
    assert METHOD.layers([2, 3, 4, 5, 6], 8, None) == [2, 3, 4, 5, 6]


def test_a_store_without_the_block_drafters_layers_is_refused_naming_them_and_the_extraction() -> None:
    with pytest.raises(MethodError, match=r"default layers \[2, 3, 4, 5, 6\].*not \[3, 5, 6\].*extract.aux_layers"):
        METHOD.layers([2, 4], 8, None)
    with pytest.raises(MethodError, match=r"default layers \[2, 3, 4, 5, 6\].*not \[5, 6\]"):
        METHOD.layers([1, 2, 3, 4, 7, 8], 8, None)  # six layers: which five is not the store's to say


def test_a_five_layer_store_of_other_layers_is_read_as_it_is_and_served_with_those_ids() -> None:
    # extract.aux_layers chose them (e.g. EAGLE-3's default three among them): the draft reads all five, and
    # SGLang's config names exactly those layers
    assert METHOD.layers([2, 8, 15, 22, 27], 30, None) == [2, 8, 15, 22, 27]
    assert METHOD.layers([2, 8, 15, 22, 27], 30, [2, 15, 27]) == [2, 15, 27]
    assert target_layer_ids([2, 8, 15, 22, 27], "llama") == [1, 7, 14, 21, 26]


def test_a_mask_token_outside_the_vocabulary_and_a_family_without_dflash_capture_are_refused() -> None:
    cfg = DraftConfig.from_target(target_config(SyntheticSpec()), num_aux=K, draft_vocab_size=96)
    with pytest.raises(DraftConfigError, match=r"train.mask_token_id 128 is not below the target's vocab_size 128"):
        METHOD.build(cfg, train=TrainConfig(method="dflash", mask_token_id=128))
    with pytest.raises(MethodError, match=r"model_type 'nope'.*no DFlash capture"):
        target_layer_ids([2, 3], "nope")
    with pytest.raises(MethodError, match=r"model_type 'nope'.*no DFlash capture.*Train train.method eagle3"):
        METHOD.check(TrainConfig(method="dflash"), {"model_type": "nope"})
    METHOD.check(TrainConfig(method="dflash"), target_config(SyntheticSpec()))  # llama: captured


def test_the_drafter_refuses_more_tokens_than_a_block_drafts() -> None:
    drafter = BlockDrafter(draft())
    drafter.start([1, 2, 3], torch.randn(2, K, 32))
    assert len(drafter.propose(B - 1)) == B - 1
    with pytest.raises(ValueError, match="block_size 4 drafts at most 3 tokens a round, not 4"):
        drafter.propose(B)


@pytest.mark.parametrize("head", ["vanilla", "gated", "rnn"])
def test_dsparks_drafter_takes_each_tokens_markov_bias_from_the_token_drafted_before_it(head: str) -> None:
    """The semi-autoregressive step: token j is the argmax of base_j + w2(latent_j), latent_j from the token before
    (the anchor before the first; gated by the row, or through the RNN's state), as training scores the block
    (step_latents, then step_logits) with the same previous tokens."""
    model = draft("dspark", markov_head=head)
    assert isinstance(model, DSparkDraft) and (model.queries, model.first) == (B - 1, 0)
    with torch.no_grad():
        model.markov_head.markov_w2.weight.normal_(std=100.0)  # a bias large enough to change the argmax
        rows = torch.randn(B - 1, model.cfg.hidden_size)
        tokens = model.draft(rows, anchor=7)
        prev = torch.tensor([7, *tokens[:-1]])
        latents = model.step_latents(rows[None], prev[None])[0]
        assert tokens == model.step_logits(rows, latents).argmax(-1).tolist()
        assert tokens != model.logits(rows).argmax(-1).tolist()  # the bias mattered


def test_the_rnn_markov_heads_state_carries_along_the_block_and_the_gated_heads_gate_reads_the_row() -> None:
    """What makes the two heads differ from the vanilla one: the RNN's step j depends on the tokens before j-1 (its
    state), the gated head's on the drafting row; the vanilla head depends on the previous token alone."""
    with torch.no_grad():
        for head, depends_on_earlier, depends_on_row in (("vanilla", False, False), ("gated", False, True),
                                                         ("rnn", True, True)):  # fmt: skip
            model = draft("dspark", markov_head=head)
            rows = torch.randn(1, B - 1, model.cfg.hidden_size)
            a, b = torch.tensor([[5, 6, 7]]), torch.tensor([[9, 6, 7]])  # differ at the first step only
            last = model.step_latents(rows, a)[0, -1]
            assert torch.equal(last, model.step_latents(rows, b)[0, -1]) != depends_on_earlier, head
            assert torch.equal(last, model.step_latents(rows * 2, a)[0, -1]) != depends_on_row, head


@pytest.mark.parametrize("method", ["dflash", "dspark"])
def test_the_flex_block_mask_names_every_pair_the_dense_mask_allows_and_gives_the_same_forward(method: str) -> None:
    """FlexAttention (CUDA training) skips the key blocks its BlockMask leaves out: every pair the dense block_mask
    allows must lie in a named block, and the per-token rule must be the dense mask's; then the forward through
    flex_attention (eager here: its reference) equals the dense one. Rows long enough that most blocks are skipped."""
    model = draft(method, block_size=16)
    q = model.queries
    batch = packed_row([300, 170, 250, 90], model.cfg.vocab_size, model.cfg.hidden_size)
    anchors, _ = pick_anchors(batch, 16, seed=0)
    dense = block_mask(batch.doc, anchors, q)
    flex = flex_block_mask(batch.doc, anchors, q)
    m, kv = dense.shape
    named = flex.to_dense()[0, 0].bool()  # [query blocks, key blocks]
    qi, ki = dense.nonzero().unbind(1)
    assert bool(named[qi // 128, ki // 128].all()), "a pair the dense mask allows lies in a skipped block"
    assert named.float().mean() < 0.5  # and it does skip: the point of it
    rule = flex.mask_mod(torch.zeros(()), torch.zeros(()), torch.arange(m)[:, None], torch.arange(kv)[None, :])
    assert torch.equal(rule, dense)
    args = (batch.aux_hidden, batch.positions, batch.input_ids[anchors], batch.positions[anchors])
    with torch.no_grad():
        torch.testing.assert_close(model(*args, flex), model(*args, dense), rtol=1e-4, atol=1e-4)


def test_dsparks_loss_is_the_published_mix_of_cross_entropy_l1_to_the_target_and_confidence_per_position() -> None:
    """DeepSpec's DSpark objective, rebuilt here one drafted token at a time: for the token at row a + i of the block
    anchored at a, the target's distribution is softmax(last_hidden[a + i - 1] @ lm_head.T) (the target's state
    before that token); per position, 0.1 x CE + 0.9 x L1(draft, target) + BCE(confidence, 1 - L1 / 2), averaged
    over the labelled blocks, then weighted by position_weights. DFlash's is the cross-entropy alone."""
    from eagle3.draft.dflash.loss import block_loss
    from eagle3.draft.distill import target_distribution

    for method in ("dspark", "dflash"):
        model = draft(method)
        batch = packed_row([11, 9], model.cfg.vocab_size, model.cfg.hidden_size)
        batch.last_hidden = torch.randn_like(batch.last_hidden)  # a target distribution that is not uniform
        d2t = torch.zeros(model.cfg.draft_vocab_size, dtype=torch.long)
        target = target_distribution(batch.last_hidden, model.lm_head, d2t, model.t2d, 64)
        anchors, real = pick_anchors(batch, B, seed=0)
        with torch.no_grad():
            out = model(batch.aux_hidden, batch.positions, batch.input_ids[anchors], batch.positions[anchors],
                        block_mask(batch.doc, anchors, model.queries))  # fmt: skip
            got = block_loss(out, model, batch, anchors, real, target, chunk_tokens=5).total
            rows = model.drafting_rows(out)  # [A, S, H]
            want = torch.zeros(())
            mix = (0.1, 0.9, 1.0) if method == "dspark" else (1.0, 0.0, 0.0)
            for i, w in enumerate(position_weights(B)):
                terms = []
                for j, a in enumerate(anchors.tolist()):
                    r = a + i + 1  # the drafted token's row
                    if r >= len(batch.doc) or batch.doc[r] != batch.doc[a]:
                        continue
                    prev = batch.input_ids[r - 1 : r]
                    before = batch.input_ids[(a + torch.arange(1, B)).clamp(max=len(batch.doc) - 1) - 1]
                    latents = model.step_latents(rows[j : j + 1], before[None])  # DFlash: None
                    lat = None if latents is None else latents[0, i : i + 1]
                    logits = model.step_logits(rows[j, i : i + 1], lat)[0]
                    p_t = torch.softmax(batch.last_hidden[r - 1] @ model.lm_head.T, -1)
                    l1 = (torch.softmax(logits, -1) - p_t).abs().sum()
                    ce = torch.nn.functional.cross_entropy(logits[None], p_t.argmax()[None])
                    conf = model.side_loss(rows[j, i : i + 1], prev, (1 - l1 / 2)[None])[0]
                    terms.append(mix[0] * ce + mix[1] * l1 + mix[2] * conf)
                want = want + w * torch.stack(terms).mean()
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
