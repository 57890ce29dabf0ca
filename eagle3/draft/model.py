"""The EAGLE-3 draft, laid out exactly as SGLang's `LlamaForCausalLMEagle3` loads it. Read top-down.

    fc                      Linear(K*H_target -> H)          fuses the K aux states of the target
    midlayer.hidden_norm    RMSNorm(H)                       on the fused (or previous-step) hidden state
    midlayer.input_layernorm RMSNorm(H)                      on the token embedding
    midlayer.self_attn      q/k/v_proj take 2H = [emb; hidden], o_proj -> H
    midlayer.post_attention_layernorm, midlayer.mlp (gate/up/down)
    norm, lm_head           RMSNorm(H), Linear(H -> draft vocab)
    embed_tokens            the target's embedding, frozen (SGLang's loader maps it to model.embed_tokens)
    d2t, t2d                draft id -> target id offset, target id -> in draft vocab (buffers)

The state dict keys are SGLang's, so export is a straight save. The forward runs the training-time
test (TTT) unrolled over `steps`, on one packed row of documents (no cross-document attention):

    step 0, position t: input (embedding of x[t+1], fc(aux[t])), RoPE position t
    step i, position t: input (embedding of x[t+1+i], the draft's own pre-norm output of step i-1 at t),
                        RoPE position t+i
    attention of step i at t: step-0 keys of its document at positions <= t (causal), plus the keys of
                        steps 1..i at t only (diagonal): the key/value cache a chained draft would hold.

Logits of step i at t predict x[t+2+i]; eagle3/draft/loss.py pairs them with the target distribution.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from eagle3.target.families import family_of
from eagle3.target.layout import text_config

# (q [N, nh, hd], k [N, nkv, hd], v [N, nkv, hd]) -> (out [N, nh, hd], logsumexp [N, nh] fp32), causal per document
AttendFn = Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]


class DraftConfigError(ValueError):
    """The target config.json lacks something the draft needs (or has an activation the draft cannot mirror)."""


MLA_DRAFT_HEAD_DIM = 128  # the published DeepSeek-V3 / Kimi EAGLE-3 drafts' (and every attention kernel's) size


@dataclass(frozen=True)
class DraftConfig:
    hidden_size: int  # H of the draft; equals the target's (the embedding is shared)
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None  # None (plain) or {"rope_type": "llama3", "factor", ...}
    max_position_embeddings: int
    target_hidden_size: int
    num_aux: int  # K
    vocab_size: int  # target vocabulary
    draft_vocab_size: int

    note: str = field(default="", compare=False)  # what from_target chose differently from the target, for logs

    @classmethod
    def from_target(cls, target: dict[str, Any], *, num_aux: int, draft_vocab_size: int) -> DraftConfig:
        """The draft of a target described by its config.json (multimodal wrappers: its text_config).

        Attention is Llama's GQA with the target's heads, except for MLA targets (DeepSeek-V3, Kimi: q/k and v
        head sizes differ, and config.json's head_dim, where present, is the rope part): head_dim 128, heads =
        H / 128, as the published DeepSeek and Kimi EAGLE-3 drafts are shaped. Which it is comes from the family's
        row (eagle3/target/families.py `attention`); a model_type with no row is MLA when it has a `kv_lora_rank`.
        RoPE is the target's when the draft can reproduce it in SGLang's Llama draft ('default', 'llama3'); any
        other scaling (yarn on DeepSeek-V3, Kimi, GPT-OSS) gives plain RoPE at the target's theta, as those
        published drafts do: the draft learns its own attention, it does not reuse the target's."""
        text = text_config(target)
        act = text.get("hidden_act", "silu")
        if act != "silu":
            raise DraftConfigError(f"target hidden_act {act!r}: the draft's Llama MLP supports only 'silu'")
        try:
            h, nh = int(text["hidden_size"]), int(text["num_attention_heads"])
            nkv, hd = int(text.get("num_key_value_heads", nh)), int(text.get("head_dim") or h // nh)
            notes = []
            if _attention(target) == "mla":
                hd = MLA_DRAFT_HEAD_DIM if h % MLA_DRAFT_HEAD_DIM == 0 else h // nh
                nh = nkv = h // hd
                notes.append(f"MLA target: the draft's attention is {nh} heads x {hd}")
            rope = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
            theta = float(rope.pop("rope_theta", text.get("rope_theta", 10000.0)))
            kind = rope.get("rope_type", rope.get("type", "default"))
            if kind not in ("default", "llama3"):
                notes.append(f"target rope_type {kind!r}: the draft uses plain RoPE at theta {theta:g}")
            return cls(
                hidden_size=h,
                intermediate_size=int(text["intermediate_size"]),
                num_heads=nh,
                num_kv_heads=nkv,
                head_dim=hd,
                rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
                rope_theta=theta,
                rope_scaling={"rope_type": "llama3", **rope} if kind == "llama3" else None,
                max_position_embeddings=int(text.get("max_position_embeddings", 8192)),
                target_hidden_size=h,
                num_aux=num_aux,
                vocab_size=int(text["vocab_size"]),
                draft_vocab_size=draft_vocab_size,
                note="; ".join(notes),
            )
        except KeyError as e:
            raise DraftConfigError(f"target config.json lacks {e.args[0]!r}") from None

    def llama_config(self) -> dict[str, Any]:
        """The config.json fields SGLang's LlamaForCausalLMEagle3 reads (export adds eagle_config)."""
        return {
            "architectures": ["LlamaForCausalLMEagle3"],
            "model_type": "llama",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "num_hidden_layers": 1,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "max_position_embeddings": self.max_position_embeddings,
            "vocab_size": self.vocab_size,
            "draft_vocab_size": self.draft_vocab_size,
            "target_hidden_size": self.target_hidden_size,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
        }


def _attention(target: dict[str, Any]) -> str:
    """The target's attention kind: its family's row, else (a family with no row, or a row that leaves it to the
    config) MLA when it has a kv_lora_rank."""
    family = family_of(str(target.get("model_type", "")))
    if family is not None and family.attention is not None:
        return family.attention
    return "mla" if text_config(target).get("kv_lora_rank") else "gqa"


# ---------------------------------------------------------------------------------------------------------------------
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


def ttt_attention(q: Tensor, cache: list[tuple[Tensor, Tensor]], attend: AttendFn) -> Tensor:
    """Attention of TTT step i = len(cache) - 1 over [step-0 keys, causal per document] + [keys of steps 1..i at
    the same position]. The step-0 part comes from `attend` with its logsumexp; the diagonal scores join it in
    one softmax, so no [N, (i+1)N] score matrix is built."""
    n, nh, hd = q.shape
    k0, v0 = cache[0]
    out0, lse0 = attend(q, k0, v0)  # [N, nh, hd], [N, nh] fp32
    if len(cache) == 1:
        return out0
    nkv = k0.shape[1]
    qg = q.float().view(n, nkv, nh // nkv, hd)  # [N, nkv, g, hd]
    scores = [lse0.view(n, nkv, -1)]
    for k, _ in cache[1:]:
        scores.append((qg * k.float()[:, :, None, :]).sum(-1) / math.sqrt(hd))  # [N, nkv, g]
    w = torch.softmax(torch.stack(scores), dim=0)  # [S, N, nkv, g]: share of each part of the key set
    out = out0.float().view(n, nkv, -1, hd) * w[0][..., None]
    for j, (_, v) in enumerate(cache[1:], start=1):
        out = out + w[j][..., None] * v.float()[:, :, None, :]
    return out.view(n, nh, hd).to(q.dtype)


def dense_attend(doc: Tensor) -> AttendFn:
    """Causal attention within documents from explicit scores: exact, O(N^2) memory (CPU, tests, reference)."""
    allowed = (doc[:, None] == doc[None, :]) & torch.ones(
        len(doc), len(doc), dtype=torch.bool, device=doc.device
    ).tril()

    def attend(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        g = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)  # [N, nh, hd]
        s = torch.einsum("qhd,khd->hqk", q.float(), k.float()) / math.sqrt(q.shape[-1])  # [nh, N, N]
        s = s.masked_fill(~allowed, float("-inf"))
        lse = torch.logsumexp(s, dim=-1)  # [nh, N]
        out = torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), v.float())  # [N, nh, hd]
        return out.to(q.dtype), lse.transpose(0, 1)

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


class FlexAttend:
    """Causal attention within documents through FlexAttention (compiled once, held here; CUDA)."""

    def __init__(self) -> None:
        from torch.nn.attention import flex_attention as fa

        self._fa = fa
        self._flex: Any = torch.compile(fa.flex_attention, dynamic=False)
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


# ---------------------------------------------------------------------------------------------------------------------
class Attention(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.nh, self.nkv, self.hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(2 * cfg.hidden_size, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(2 * cfg.hidden_size, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(2 * cfg.hidden_size, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, cfg.hidden_size, bias=False)

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, cache: list[tuple[Tensor, Tensor]], attend: AttendFn
    ) -> Tensor:
        n = x.shape[0]
        q = apply_rope(self.q_proj(x).view(n, self.nh, self.hd), cos, sin)  # [N, nh, hd]
        k = apply_rope(self.k_proj(x).view(n, self.nkv, self.hd), cos, sin)  # [N, nkv, hd]
        v = self.v_proj(x).view(n, self.nkv, self.hd)  # [N, nkv, hd]
        cache.append((k, v))
        out = ttt_attention(q, cache, attend)  # [N, nh, hd]
        return self.o_proj(out.reshape(n, self.nh * self.hd))  # [N, H]


class MLP(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """SGLang's Eagle3 LlamaDecoderLayer: attention over [input_layernorm(emb); hidden_norm(hidden)]."""

    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(
        self,
        emb: Tensor,
        hidden: Tensor,
        cos: Tensor,
        sin: Tensor,
        cache: list[tuple[Tensor, Tensor]],
        attend: AttendFn,
    ) -> Tensor:
        x = torch.cat([self.input_layernorm(emb), self.hidden_norm(hidden)], dim=-1)  # [N, 2H]
        h = hidden + self.self_attn(x, cos, sin, cache, attend)  # residual is the un-normed hidden state
        return h + self.mlp(self.post_attention_layernorm(h))  # [N, H], pre-norm: fed to the next step


class Eagle3Draft(nn.Module):
    d2t: Tensor  # buffers, typed for the checker
    t2d: Tensor
    inv_freq: Tensor

    def __init__(self, cfg: DraftConfig, embed_weight: Tensor | None = None):
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        self.embed_tokens = nn.Embedding(cfg.vocab_size, h)
        self.embed_tokens.weight.requires_grad_(False)  # frozen: the target's
        if embed_weight is not None:
            self.load_embedding(embed_weight)
        self.fc = nn.Linear(cfg.num_aux * cfg.target_hidden_size, h, bias=False)
        self.midlayer = DecoderLayer(cfg)
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(h, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))
        self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)

    def compile_blocks(self) -> None:
        """torch.compile the per-token blocks in place (keys unchanged); attention stays eager around flex."""
        for m in (
            self.midlayer.mlp,
            self.midlayer.post_attention_layernorm,
            self.midlayer.input_layernorm,
            self.midlayer.hidden_norm,
            self.norm,
        ):
            m.compile(dynamic=False)

    def load_embedding(self, weight: Tensor) -> None:
        if tuple(weight.shape) != (self.cfg.vocab_size, self.cfg.hidden_size):
            raise DraftConfigError(
                f"target embedding is {tuple(weight.shape)}, the draft expects ({self.cfg.vocab_size}, "
                f"{self.cfg.hidden_size}) from config.json"
            )
        with torch.no_grad():
            self.embed_tokens.weight = nn.Parameter(weight.detach().clone(), requires_grad=False)

    def set_vocab_map(self, d2t: Tensor, t2d: Tensor) -> None:
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)

    def forward(
        self, input_ids: Tensor, aux_hidden: Tensor, positions: Tensor, remaining: Tensor, attend: AttendFn, steps: int
    ) -> list[Tensor]:
        """input_ids [N], aux_hidden [N, K, H_t], positions [N] (within the document), remaining [N] (tokens after
        this one in its document). Returns the logits of each TTT step, steps x [N, draft vocab]."""
        n = input_ids.shape[0]
        hidden = self.fc(aux_hidden.flatten(1))  # [N, H]
        ids_ahead = F.pad(input_ids, (0, steps + 1))  # [N + steps + 1]
        cache: list[tuple[Tensor, Tensor]] = []
        logits = []
        for i in range(steps):
            ids = torch.where(remaining > i, ids_ahead[1 + i : 1 + i + n], 0)  # x[t+1+i], 0 past the document end
            emb = self.embed_tokens(ids)  # [N, H], frozen
            cos, sin = rope_cos_sin(self.inv_freq, positions + i)  # [N, 1, hd]
            hidden = self.midlayer(emb, hidden, cos, sin, cache, attend)  # [N, H]
            logits.append(self.lm_head(self.norm(hidden)))  # [N, draft vocab]
        return logits

    def trainable_state_dict(self) -> dict[str, Tensor]:
        """Everything but the frozen embedding (checkpoints reload it from the target)."""
        return {k: v for k, v in self.state_dict().items() if k != "embed_tokens.weight"}
