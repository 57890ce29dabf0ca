"""Building blocks every draft method shares: RMSNorm, RoPE, the SwiGLU MLP, and causal attention within the
documents of one packed row (dense for CPU and tests, FlexAttention on CUDA).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from eagle3.draft.shape import DraftConfig

# (q [N, nh, hd], k [N, nkv, hd], v [N, nkv, hd]) -> (out [N, nh, hd], logsumexp [N, nh] fp32), causal per document
AttendFn = Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * x).to(dtype)


def rope_inv_freq(cfg: DraftConfig) -> Tensor:
    """[hd/2] inverse frequencies; 'llama3' scaling as in Llama 3.1 (and transformers' _compute_llama3_parameters)."""
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    s = cfg.rope_scaling
    if s is None:
        return inv.float()
    factor, low, high = float(s["factor"]), float(s["low_freq_factor"]), float(s["high_freq_factor"])
    old = float(s["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old / low, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    mid = (wavelen >= old / high) & (wavelen <= old / low)
    return torch.where(mid, (1 - smooth) * scaled / factor + smooth * scaled, scaled).float()


def rope_cos_sin(inv_freq: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
    freqs = positions.float()[:, None] * inv_freq[None, :]  # [N, hd/2]
    emb = torch.cat([freqs, freqs], dim=-1)  # [N, hd]
    return emb.cos()[:, None, :], emb.sin()[:, None, :]  # [N, 1, hd] each


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


#: Queries per block of dense_attend. Each block is scored against the keys from its first query's document start to
#: its last query, so a row of short documents costs about N x (block + document length) scores, not N^2 (the
#: demo store's 2048-token rows: docs/performance.md, the peers' table).
DENSE_BLOCK = 128
#: A block scored against more keys than this (a long document's) is recomputed in backward (activation
#: checkpointing), so a long sample's step holds O(DENSE_KEYS x N) scores, not O(N^2). An 8.5K-token step of the
#: tiny Qwen3's draft (4 heads, 2 TTT steps): 8 GB in one product, 0.5 GB in blocks
#: (tests/integration/test_long_context.py).
DENSE_KEYS = 512
#: A longer row takes fewer queries a block, so that one block's scores stay within this many fp32 elements (32 MB),
#: down to DENSE_MIN_BLOCK queries: the attention's share of a step's memory then stays the same at any length (a
#: 31.5K-token step of the tiny Qwen3's draft peaked at 1.6 GB with blocks of 512, 0.6 GB so; docs/performance.md).
DENSE_SCORES = 1 << 23
DENSE_MIN_BLOCK = 64


def document_starts(doc: Tensor) -> Tensor:
    """[N] index of the first token of each token's document, in a packed row whose document ids never decrease."""
    idx = torch.arange(len(doc), device=doc.device)
    new = torch.ones_like(doc, dtype=torch.bool)
    new[1:] = doc[1:] != doc[:-1]
    return torch.cummax(torch.where(new, idx, 0), dim=0).values


def dense_attend(
    doc: Tensor,
    block: int = DENSE_BLOCK,
    keys: int = DENSE_KEYS,
    scores_budget: int = DENSE_SCORES,
    min_block: int = DENSE_MIN_BLOCK,
) -> AttendFn:
    """Causal attention within documents from explicit scores: exact (CPU, tests, reference). Queries go by blocks
    of at most `block` (fewer for a long row: one block's scores within `scores_budget` elements, down to
    `min_block` queries), each against the keys from its first query's document start to its last query (every key
    any of them may see): the keys of other documents and of later positions, whose weights are 0, are not scored. A
    block over more than `keys` keys is recomputed in backward."""
    n = len(doc)
    pos = torch.arange(n, device=doc.device)
    starts = document_starts(doc).tolist() if n else []

    def scores(q: Tensor, k: Tensor, v: Tensor, lo: int, ks: int) -> tuple[Tensor, Tensor]:
        """Queries lo .. lo+m against keys ks .. ks+len(k); q [m, nh, hd], k and v [keys, nkv, hd]."""
        (m, nh, hd), nkv = q.shape, k.shape[1]
        hi = ks + k.shape[0]
        allowed = (doc[lo : lo + m, None] == doc[None, ks:hi]) & (pos[None, ks:hi] <= pos[lo : lo + m, None])
        qg = q.float().view(m, nkv, nh // nkv, hd)  # the query heads of each key head: no repeated keys
        s = torch.einsum("qcgd,kcd->cgqk", qg, k.float()) / math.sqrt(hd)  # [nkv, g, m, keys]
        s = s.masked_fill(~allowed, float("-inf"))
        lse = torch.logsumexp(s, dim=-1)  # [nkv, g, m]
        out = torch.einsum("cgqk,kcd->qcgd", torch.softmax(s, dim=-1), v.float())  # [m, nkv, g, hd]
        return out.reshape(m, nh, hd).to(q.dtype), lse.reshape(nh, m).transpose(0, 1)

    def attend(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        from torch.utils.checkpoint import checkpoint

        m = min(block, max(min_block, scores_budget // (q.shape[1] * max(n, 1))))  # queries a block
        parts = []
        for lo in range(0, n, m):
            hi, ks = min(lo + m, n), starts[lo]
            args = (q[lo:hi], k[ks:hi], v[ks:hi], lo, ks)
            parts.append(checkpoint(scores, *args, use_reentrant=False) if hi - ks > keys else scores(*args))
        if len(parts) == 1:
            return parts[0]
        return torch.cat([o for o, _ in parts]), torch.cat([lse for _, lse in parts])

    return attend


#: FlexAttention's block edge: the block mask says, per (query block, key block), none / some / all allowed.
FLEX_BLOCK = 128


def document_blocks(doc: Tensor, block: int = FLEX_BLOCK) -> tuple[Tensor, Tensor]:
    """Causal attention within documents, per pair of blocks of `block` tokens of one packed row whose document ids
    `doc` [N] never decrease: (some [nb, nb], full [nb, nb]) booleans, `some` where any query of block i may see
    any key of block j, `full` where every one may see every one. From each block's first and last document alone,
    so nothing is compiled: torch's create_block_mask evaluates the mask per token pair and, compiled, took minutes
    to compile cold on an H200 (bench/compile_probe.py, docs/performance.md)."""
    n = len(doc)
    nb = -(-n // block)
    padded = torch.cat([doc, doc[-1:].expand(nb * block - n)])  # a cut-off last block ends in the row's last document
    first, last = padded.view(nb, block)[:, 0], padded.view(nb, block)[:, -1]
    i = torch.arange(nb, device=doc.device)[:, None]
    j = i.T
    some = (j <= i) & (last[None, :] >= first[:, None])  # key block j reaches into query block i's documents
    one = first == last  # the block lies in one document
    full = (j < i) & one[:, None] & one[None, :] & (first[:, None] == first[None, :])
    full &= i * block + block <= n  # a cut-off last block is partial: its tail is past the row's end
    return some & ~full, full


def _as_kv_blocks(blocks: Tensor) -> tuple[Tensor, Tensor]:
    """[nb, nb] booleans -> BlockMask's (counts [1, 1, nb], indices [1, 1, nb, nb]) int32, ascending per row."""
    counts = blocks.sum(-1, dtype=torch.int32)
    order = torch.argsort((~blocks).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return counts[None, None], order[None, None]


@functools.cache
def compiled_flex() -> Any:
    """torch's flex_attention, compiled once per process (its eager form materialises every score)."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def as_block_mask(blocks: Tensor, mask_mod: Any, q_len: int, kv_len: int) -> Any:
    """FlexAttention's BlockMask from the [query blocks, key blocks] booleans where any pair may attend (each such
    block evaluates `mask_mod` per token): nothing compiled, unlike create_block_mask (document_blocks)."""
    from torch.nn.attention.flex_attention import BlockMask

    return BlockMask.from_kv_blocks(*_as_kv_blocks(blocks), BLOCK_SIZE=FLEX_BLOCK, mask_mod=mask_mod,
                                    seq_lengths=(q_len, kv_len))  # fmt: skip


class FlexAttend:
    """Causal attention within documents through FlexAttention (compiled once, held here; CUDA)."""

    def __init__(self) -> None:
        from torch.nn.attention import flex_attention as fa

        self._fa = fa
        self._flex: Any = compiled_flex()
        self._aux = fa.AuxRequest(lse=True) if hasattr(fa, "AuxRequest") else None

    def block_mask(self, doc: Tensor) -> Any:
        """The row's BlockMask, built from its document blocks (document_blocks), the token rule for partial ones."""

        def same_doc_causal(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return (doc[q_idx] == doc[kv_idx]) & (kv_idx <= q_idx)

        partial, full = document_blocks(doc)
        n = len(doc)
        return self._fa.BlockMask.from_kv_blocks(*_as_kv_blocks(partial), *_as_kv_blocks(full), BLOCK_SIZE=FLEX_BLOCK,
                                                 mask_mod=same_doc_causal, seq_lengths=(n, n))  # fmt: skip

    def __call__(self, doc: Tensor) -> AttendFn:
        block_mask = self.block_mask(doc)

        def attend(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
            qb, kb, vb = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))  # [1, heads, N, hd]
            if self._aux is not None:
                out, aux = self._flex(qb, kb, vb, block_mask=block_mask, enable_gqa=True, return_aux=self._aux)
                lse = aux.lse
            else:
                out, lse = self._flex(qb, kb, vb, block_mask=block_mask, enable_gqa=True, return_lse=True)
            return out[0].transpose(0, 1), lse[0].transpose(0, 1).float()

        return attend


class MLP(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftKV:
    """The draft's key/value cache: step-0 entries of the committed positions, then a chain's entries while
    it is drafted. `attend` is the model's AttendFn: new queries see every cached key and the new ones causally."""

    def __init__(self) -> None:
        self.k: Tensor | None = None  # [L, nkv, hd]
        self.v: Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.shape[0]

    def crop(self, length: int) -> None:
        if self.k is not None and self.v is not None:
            self.k, self.v = self.k[:length], self.v[:length]

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        past = len(self)
        self.k = k if self.k is None else torch.cat([self.k, k])  # [past + m, nkv, hd]
        self.v = v if self.v is None else torch.cat([self.v, v])
        m, nh, hd = q.shape
        g = nh // k.shape[1]
        keys, values = self.k.repeat_interleave(g, dim=1), self.v.repeat_interleave(g, dim=1)  # [L, nh, hd]
        s = torch.einsum("qhd,khd->hqk", q.float(), keys.float()) / math.sqrt(hd)  # [nh, m, L]
        allowed = torch.arange(past + m, device=q.device)[None, :] <= past + torch.arange(m, device=q.device)[:, None]
        s = s.masked_fill(~allowed, float("-inf"))
        out = torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), values.float())  # [m, nh, hd]
        return out.to(q.dtype), torch.logsumexp(s, dim=-1).transpose(0, 1)
