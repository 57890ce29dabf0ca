"""The draft model: SGLang's key names and shapes, RoPE, and the training-time-test attention pattern."""

from __future__ import annotations

import math

import pytest
import torch

from eagle3.draft.eagle3.model import Eagle3Draft, ttt_attention
from eagle3.draft.layers import dense_attend, rope_inv_freq
from eagle3.draft.shape import DraftConfig

TARGET = {
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 100,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "max_position_embeddings": 4096,
    "hidden_act": "silu",
}


def tiny(**kw: object) -> tuple[DraftConfig, Eagle3Draft]:
    torch.manual_seed(0)
    cfg = DraftConfig.from_target({**TARGET, **kw}, num_aux=3, draft_vocab_size=40)
    model = Eagle3Draft(cfg, torch.randn(cfg.vocab_size, cfg.hidden_size))
    ids = torch.randperm(cfg.vocab_size)[:40].sort().values
    t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    t2d[ids] = True
    model.set_vocab_map(ids - torch.arange(40), t2d)
    return cfg, model


def packed(lengths: list[int]) -> dict[str, torch.Tensor]:
    doc = torch.cat([torch.full((t,), d) for d, t in enumerate(lengths)])
    pos = torch.cat([torch.arange(t) for t in lengths])
    rem = torch.cat([torch.arange(t - 1, -1, -1) for t in lengths])
    return {"doc": doc, "positions": pos, "remaining": rem}


def test_state_dict_keys_and_shapes_are_what_sglang_llama_eagle3_loads() -> None:
    _, model = tiny()
    h, q, kv, i = 32, 4 * 8, 2 * 8, 48
    expected = {
        "embed_tokens.weight": (100, h),
        "fc.weight": (h, 3 * h),
        "midlayer.hidden_norm.weight": (h,),
        "midlayer.input_layernorm.weight": (h,),
        "midlayer.self_attn.q_proj.weight": (q, 2 * h),
        "midlayer.self_attn.k_proj.weight": (kv, 2 * h),
        "midlayer.self_attn.v_proj.weight": (kv, 2 * h),
        "midlayer.self_attn.o_proj.weight": (h, q),
        "midlayer.post_attention_layernorm.weight": (h,),
        "midlayer.mlp.gate_proj.weight": (i, h),
        "midlayer.mlp.up_proj.weight": (i, h),
        "midlayer.mlp.down_proj.weight": (h, i),
        "norm.weight": (h,),
        "lm_head.weight": (40, h),
        "d2t": (40,),
        "t2d": (100,),
    }
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == expected
    assert set(model.trainable_state_dict()) == set(expected) - {"embed_tokens.weight"}
    assert model.state_dict()["d2t"].dtype == torch.int64 and model.state_dict()["t2d"].dtype == torch.bool


def test_the_embedding_is_the_targets_and_frozen() -> None:
    cfg, model = tiny()
    weight = torch.randn(cfg.vocab_size, cfg.hidden_size)
    model.load_embedding(weight)
    assert torch.equal(model.embed_tokens.weight, weight)
    assert not model.embed_tokens.weight.requires_grad
    with pytest.raises(ValueError, match=r"\(100, 32\)"):
        model.load_embedding(torch.randn(99, 32))


def test_forward_returns_draft_vocab_logits_for_each_ttt_step() -> None:
    _, model = tiny()
    b = packed([7, 5])
    ids = torch.randint(0, 100, (12,))
    logits = model(ids, torch.randn(12, 3, 32), b["positions"], b["remaining"], dense_attend(b["doc"]), 4)
    assert len(logits) == 4 and all(z.shape == (12, 40) for z in logits)
    logits[3].sum().backward()
    assert model.fc.weight.grad is not None and model.embed_tokens.weight.grad is None


def test_llama3_rope_scaling_matches_transformers() -> None:
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    target = {**TARGET, "hidden_size": 512, "num_attention_heads": 4, "rope_parameters": rope}
    cfg = DraftConfig.from_target(target, num_aux=3, draft_vocab_size=40)
    hf = LlamaConfig(hidden_size=512, num_attention_heads=4, rope_parameters=rope, max_position_embeddings=131072)
    ref, _ = ROPE_INIT_FUNCTIONS["llama3"](hf, "cpu")
    torch.testing.assert_close(rope_inv_freq(cfg), ref.float(), rtol=1e-6, atol=0)
    assert cfg.rope_theta == 500000.0 and cfg.rope_scaling is not None and cfg.rope_scaling["factor"] == 8.0


#: The fields the draft reads, as the published config.json files of the models users serve have them.
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 7168, "intermediate_size": 18432,
    "num_attention_heads": 128, "num_key_value_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512,
    "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128, "vocab_size": 129280, "hidden_act": "silu",
    "rms_norm_eps": 1e-6, "max_position_embeddings": 163840, "rope_theta": 10000,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
}  # fmt: skip
KIMI_K25 = {  # a vision wrapper around a DeepSeek-V3 text backbone with 64 heads and 163,840 tokens
    "architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
    "text_config": {**DEEPSEEK_V3, "num_attention_heads": 64, "num_key_value_heads": 64, "vocab_size": 163840,
                    "max_position_embeddings": 262144, "rope_theta": 50000.0,
                    "rope_scaling": {"factor": 64.0, "original_max_position_embeddings": 4096, "type": "yarn",
                                     "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}},
}  # fmt: skip
GPT_OSS_120B = {
    "architectures": ["GptOssForCausalLM"], "hidden_size": 2880, "intermediate_size": 2880, "head_dim": 64,
    "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 201088, "hidden_act": "silu",
    "rms_norm_eps": 1e-5, "max_position_embeddings": 131072, "rope_theta": 150000,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                     "rope_type": "yarn", "truncate": False},
}  # fmt: skip


@pytest.mark.parametrize(
    ("target", "heads", "kv_heads", "head_dim", "theta", "vocab"),
    [
        (DEEPSEEK_V3, 56, 56, 128, 10000.0, 129280),
        (KIMI_K25, 56, 56, 128, 50000.0, 163840),
        (GPT_OSS_120B, 64, 8, 64, 150000.0, 201088),
    ],
    ids=["deepseek-v3", "kimi-k2.5", "gpt-oss-120b"],
)
def test_a_yarn_or_mla_target_gets_the_draft_shape_the_published_drafts_use(
    target: dict[str, object], heads: int, kv_heads: int, head_dim: int, theta: float, vocab: int
) -> None:
    """Yarn (DeepSeek-V3, Kimi, GPT-OSS): plain RoPE at the target's theta, as SGLang will run the exported
    config; MLA (config head_dim, where given, is the rope part): 128-wide heads filling H."""
    cfg = DraftConfig.from_target(target, num_aux=3, draft_vocab_size=32000)
    got = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rope_theta, cfg.vocab_size)
    assert got == (heads, kv_heads, head_dim, theta, vocab)
    assert cfg.rope_scaling is None and "yarn" in cfg.note
    exported = cfg.llama_config()
    assert exported["rope_scaling"] is None and exported["rope_theta"] == theta and exported["head_dim"] == head_dim


def test_a_draft_of_a_yarn_mla_target_trains_with_plain_rope() -> None:
    """The MLA + yarn shape path end to end on a small config: forward and backward run, RoPE is plain."""
    small = {**DEEPSEEK_V3, "hidden_size": 256, "intermediate_size": 64, "num_attention_heads": 8,
             "num_key_value_heads": 8, "vocab_size": 100}  # fmt: skip
    cfg, model = tiny(**small)
    assert (cfg.num_heads, cfg.head_dim) == (2, 128)
    plain = 1.0 / (10000.0 ** (torch.arange(0, 128, 2, dtype=torch.float64) / 128))
    torch.testing.assert_close(rope_inv_freq(cfg), plain.float())
    b = packed([5, 7])
    ids = torch.randint(0, cfg.vocab_size, (12,))
    logits = model(ids, torch.randn(12, 3, 256), b["positions"], b["remaining"], dense_attend(b["doc"]), 2)
    assert all(z.shape == (12, 40) and torch.isfinite(z).all() for z in logits)
    logits[1].sum().backward()
    assert model.fc.weight.grad is not None and torch.isfinite(model.fc.weight.grad).all()


def test_ttt_attention_equals_softmax_over_concatenated_per_step_keys_with_causal_then_diagonal_mask() -> None:
    torch.manual_seed(1)
    n, nh, nkv, hd, steps = 9, 4, 2, 8, 4
    doc = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 1])
    cache = [(torch.randn(n, nkv, hd), torch.randn(n, nkv, hd)) for _ in range(steps)]
    q = torch.randn(n, nh, hd)
    for i in range(steps):
        got = ttt_attention(q, cache[: i + 1], dense_attend(doc))
        # reference: keys of steps 0..i laid end to end, SpecForge's mask, one softmax
        k = torch.cat([c[0] for c in cache[: i + 1]]).repeat_interleave(nh // nkv, 1)  # [(i+1)N, nh, hd]
        v = torch.cat([c[1] for c in cache[: i + 1]]).repeat_interleave(nh // nkv, 1)
        kv_step = torch.arange((i + 1) * n) // n
        kv_pos = torch.arange((i + 1) * n) % n
        qpos = torch.arange(n)[:, None]
        allowed = torch.where(kv_step == 0, (kv_pos <= qpos) & (doc[kv_pos] == doc[:, None]), kv_pos == qpos)
        s = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd)
        ref = torch.einsum("hqk,khd->qhd", torch.softmax(s.masked_fill(~allowed, float("-inf")), -1), v)
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_step_i_logits_at_t_depend_only_on_tokens_up_to_t_plus_1_plus_i_and_aux_up_to_t() -> None:
    _, model = tiny()
    b = packed([10, 6])
    n, steps = 16, 3
    torch.manual_seed(2)
    ids, aux = torch.randint(0, 100, (n,)), torch.randn(n, 3, 32)

    def run(ids: torch.Tensor, aux: torch.Tensor) -> list[torch.Tensor]:
        with torch.no_grad():
            return model(ids, aux, b["positions"], b["remaining"], dense_attend(b["doc"]), steps)

    base = run(ids, aux)
    t = 3
    for i in range(steps):
        far = 1 + t + i + 1  # the first token step i at t must not see
        ids2 = ids.clone()
        ids2[far:10] = (ids2[far:10] + 1) % 100
        aux2 = aux.clone()
        aux2[t + 1 : 10] += 1.0
        got = run(ids2, aux2)
        torch.testing.assert_close(got[i][: t + 1], base[i][: t + 1], rtol=0, atol=0)
        # the other document is untouched by anything in this one
        torch.testing.assert_close(got[i][10:], base[i][10:], rtol=0, atol=0)
        # and the step does see its own input token x[t+1+i] (so the check above is not vacuous)
        ids3 = ids.clone()
        ids3[t + 1 + i] = (ids3[t + 1 + i] + 1) % 100
        assert not torch.allclose(run(ids3, aux)[i][t], base[i][t])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlexAttention path runs on CUDA")
def test_flex_attention_matches_the_dense_reference_forward_and_backward_on_cuda() -> None:
    from eagle3.draft.layers import FlexAttend

    torch.manual_seed(0)
    n, nh, nkv, hd = 1024, 8, 2, 64
    doc = torch.repeat_interleave(torch.arange(4, device="cuda"), torch.tensor([300, 200, 400, 124], device="cuda"))
    flex = FlexAttend()
    q = torch.randn(n, nh, hd, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    cache = [
        tuple(torch.randn(n, nkv, hd, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
        for _ in range(3)
    ]
    leaves = [q, *[t for kv in cache for t in kv]]
    results = []
    for attend in (flex(doc), dense_attend(doc)):
        out = ttt_attention(q, cache, attend)  # type: ignore[arg-type]
        grads = torch.autograd.grad((out.float() ** 2).sum(), leaves)
        results.append([out.detach().float(), *[g.float() for g in grads]])
    for a, b in zip(*results, strict=True):
        assert float((a - b).norm() / b.norm()) < 2e-2


def _blocks_of(num: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """A BlockMask's (counts [1, 1, nb], indices [1, 1, nb, nb]) as booleans [nb, nb]."""
    nb = num.shape[-1]
    out = torch.zeros(nb, idx.shape[-1], dtype=torch.bool)
    for r in range(nb):
        out[r, idx[0, 0, r, : int(num[0, 0, r])].long()] = True
    return out


@pytest.mark.parametrize("seed", range(6))
def test_the_block_mask_built_from_document_blocks_is_the_one_create_block_mask_evaluates(seed: int) -> None:
    """FlexAttend builds its BlockMask from each 128-token block's first and last document (nothing to compile; the
    compiled create_block_mask took minutes cold on an H200): the same partial and full blocks as torch's
    create_block_mask, which evaluates the rule token pair by token pair, for packed rows of documents from one
    token to many blocks long, rows that are a multiple of the block and rows that are not."""
    from torch.nn.attention import flex_attention as fa

    from eagle3.draft.layers import FlexAttend

    g = torch.Generator().manual_seed(seed)
    n = (1000, 2048, 1280, 777, 4096, 130)[seed]
    lengths: list[int] = []
    while sum(lengths) < n:  # short documents, single tokens and ones spanning blocks
        kind = int(torch.randint(0, 3, (1,), generator=g))
        lengths.append(int(torch.randint(1, (2, 60, 700)[kind], (1,), generator=g)))
    lengths[-1] -= sum(lengths) - n
    lengths = [x for x in lengths if x > 0]
    doc = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths)).to(torch.int32)

    def same_doc_causal(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        return (doc[q_idx] == doc[kv_idx]) & (kv_idx <= q_idx)

    want = fa.create_block_mask(same_doc_causal, None, None, n, n, device="cpu")
    got = FlexAttend().block_mask(doc)
    assert got.seq_lengths == want.seq_lengths and got.BLOCK_SIZE == want.BLOCK_SIZE
    partial = _blocks_of(got.kv_num_blocks, got.kv_indices)
    full = _blocks_of(got.full_kv_num_blocks, got.full_kv_indices)
    assert torch.equal(partial, _blocks_of(want.kv_num_blocks, want.kv_indices))
    assert torch.equal(full, _blocks_of(want.full_kv_num_blocks, want.full_kv_indices))
    assert full.any() or n < 512  # the rows hold whole blocks of one document, so the full case is exercised
    assert torch.equal(got.to_dense(), want.to_dense())


def _whole_row_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, doc: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference: one [heads, N, N] product over the whole row, masked to causal within documents."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    pos = torch.arange(len(doc))
    allowed = (doc[:, None] == doc[None, :]) & (pos[None, :] <= pos[:, None])
    s = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), v), torch.logsumexp(s, -1).T


@pytest.mark.parametrize(("block", "keys"), [(128, 512), (16, 512), (16, 40), (7, 10)])
def test_dense_attention_by_blocks_equals_the_whole_row_product_with_its_gradients(block: int, keys: int) -> None:
    """The CPU attention scores each block of queries against the keys of its documents only (recomputing in
    backward the blocks over more than `keys` keys): the same outputs, logsumexp and gradients as one [N, N] product
    over the whole row, for documents shorter than a block, crossing block edges, many blocks long, one token long,
    and the row's padding (one more document)."""
    torch.manual_seed(0)
    lengths = [23, 1, 30, 7, 95, 2, 40]  # 95: longer than `keys` for the small settings, so some blocks recompute
    doc = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths)).to(torch.int32)
    q, k, v = torch.randn(len(doc), 6, 8), torch.randn(len(doc), 2, 8), torch.randn(len(doc), 2, 8)
    results = []
    for attend in (lambda *x: _whole_row_attention(*x, doc), dense_attend(doc, block=block, keys=keys)):
        qq, kk, vv = (x.clone().requires_grad_() for x in (q, k, v))
        out, lse = attend(qq, kk, vv)
        (out.square().sum() + lse.sin().sum()).backward()
        results.append([out, lse, qq.grad, kk.grad, vv.grad])
    for whole, blocked in zip(*results, strict=True):
        torch.testing.assert_close(blocked, whole, atol=1e-5, rtol=1e-5)


def test_a_target_with_another_activation_gets_a_silu_draft_and_says_so() -> None:
    """Apertus (xIELU): the draft is SGLang's Llama layer, whose MLP is SiLU whatever the target's."""
    cfg = DraftConfig.from_target({**TARGET, "hidden_act": "xielu"}, num_aux=3, draft_vocab_size=40)
    assert cfg == DraftConfig.from_target(TARGET, num_aux=3, draft_vocab_size=40)
    assert "target hidden_act 'xielu': the draft's MLP uses silu" in cfg.note
    assert cfg.llama_config()["hidden_act"] == "silu"


@pytest.mark.parametrize("budget", [1 << 23, 4 * 40 * 3])  # blocks of the row's `block`; of 3 queries (the budget)
def test_blocked_dense_attention_equals_one_product_in_outputs_and_gradients(budget: int) -> None:
    """A row longer than dense_attend's block goes by blocks of queries under checkpointing (fewer queries a block
    for a long row, its scores within the budget): the same outputs, log-sum-exps and gradients as one product, for a
    row of several documents and grouped KV heads."""
    torch.manual_seed(0)
    doc = torch.tensor([0] * 13 + [1] * 20 + [2] * 7)  # 40 tokens, three documents
    q0, k0, v0 = torch.randn(40, 4, 8), torch.randn(40, 2, 8), torch.randn(40, 2, 8)

    def run(block: int) -> list[torch.Tensor]:
        q, k, v = (x.clone().requires_grad_() for x in (q0, k0, v0))
        out, lse = dense_attend(doc, block=block, scores_budget=budget, min_block=3)(q, k, v)
        (out.square().sum() + lse.sum()).backward()
        return [out, lse, q.grad, k.grad, v.grad]  # type: ignore[list-item]

    for got, want in zip(run(8), run(40), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
