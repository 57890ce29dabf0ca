"""The DFlash draft, laid out exactly as SGLang 0.5.23's `DFlashDraftModel` (sglang/srt/models/dflash.py) loads it.
Read top-down.

    fc                          Linear(K*H -> H)      the K target states of a token, concatenated, projected
    hidden_norm                 RMSNorm(H)            on fc's output: the context feature of that token
    layers.{i}.input_layernorm  RMSNorm(H)            pre-norm of the block's stream (never of the context)
    layers.{i}.self_attn        q/k/v_proj H -> heads, q_norm/k_norm RMSNorm(head_dim) before RoPE, o_proj
    layers.{i}.post_attention_layernorm, layers.{i}.mlp (gate/up/down; SGLang merges gate and up)
    norm                        RMSNorm(H)            the block's output, read by the target's lm_head
    embed_tokens, lm_head       the target's, frozen; not the draft's weights (SGLang borrows both)
    d2t, t2d                    the store's vocab map (buffers every draft carries; a DFlash draft drafts over the
                                whole target vocabulary and SGLang ignores them)

How target states enter: each context token's feature c = hidden_norm(fc([h_l1; ..; h_lK])) is turned, in every
draft layer, into that layer's keys and values directly (k_proj, k_norm, RoPE at the token's position; v_proj),
without the layer's input_layernorm (SGLang's _append_target_hidden_sequential). Queries come only from the block.

A block anchored at position p: tokens [x[p], m, .., m] (m = mask_token_id) at RoPE positions p..p+B-1; it attends
to the context features of positions 0..p-1 (the target has verified them: their states exist) and to all B block
positions (no causal mask inside the block: SGLang's ENCODER_ONLY attention). The output at block position i >= 1,
norm(h_i) @ lm_head.T, drafts x[p+i].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from eagle3.draft.layers import MLP, RMSNorm, apply_rope, compiled_flex, rope_cos_sin, rope_inv_freq
from eagle3.draft.shape import DraftConfig, DraftConfigError

KV = tuple[Tensor, Tensor]  # keys, values [L, nkv, hd]
Mask = Tensor | BlockMask  # which keys a block's query sees: dense [M, L + M] bool, or FlexAttention's blocks


class Attention(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        h, self.nh, self.nkv, self.hd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(h, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(h, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(h, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, h, bias=False)
        self.q_norm = RMSNorm(self.hd, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.hd, cfg.rms_norm_eps)

    def kv(self, x: Tensor, cos: Tensor, sin: Tensor) -> KV:
        """Keys and values of x [L, H] (block positions, or context features as they are)."""
        n = x.shape[0]
        k = apply_rope(self.k_norm(self.k_proj(x).view(n, self.nkv, self.hd)), cos, sin)  # [L, nkv, hd]
        return k, self.v_proj(x).view(n, self.nkv, self.hd)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, ctx: KV, mask: Mask) -> Tensor:
        """x [M, H] block positions; ctx: the context keys/values [L, nkv, hd]; mask [M, L + M] bool, True where a
        query may see a key (context first, then the block positions), or the same rule as a BlockMask."""
        m = x.shape[0]
        q = apply_rope(self.q_norm(self.q_proj(x).view(m, self.nh, self.hd)), cos, sin)  # [M, nh, hd]
        k, v = self.kv(x, cos, sin)
        keys, values = torch.cat([ctx[0], k]), torch.cat([ctx[1], v])  # [L + M, nkv, hd]
        qh, kh, vh = q.transpose(0, 1), keys.transpose(0, 1).to(q.dtype), values.transpose(0, 1).to(q.dtype)
        if isinstance(mask, Tensor):
            out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, enable_gqa=True)  # [nh, M, hd]
        else:  # FlexAttention: only the blocks the mask names (loss.flex_block_mask)
            flex = compiled_flex() if q.is_cuda else flex_attention  # eager on CPU: the reference, for tests
            out = flex(qh[None], kh[None], vh[None], block_mask=mask, enable_gqa=True)[0]
        return self.o_proj(out.transpose(0, 1).reshape(m, self.nh * self.hd))  # [M, H]


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, ctx: KV, mask: Mask) -> Tensor:
        h = x + self.self_attn(self.input_layernorm(x), cos, sin, ctx, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


@dataclass(frozen=True)
class LossMix:
    """A block drafter's objective per drafted position (eagle3/draft/dflash/loss.py): ce x the cross-entropy against
    the target's token, l1 x the L1 distance to the target's distribution, confidence x the confidence head's loss."""

    ce: float = 1.0
    l1: float = 0.0
    confidence: float = 0.0

    @property
    def needs_target(self) -> bool:
        """Whether the loss reads the target's whole distribution at the drafted positions."""
        return self.l1 > 0 or self.confidence > 0


class DFlashDraft(nn.Module):
    loss_mix = LossMix()  # DFlash: the position-weighted cross-entropy alone
    d2t: Tensor  # buffers, typed for the checker
    t2d: Tensor
    inv_freq: Tensor
    lm_head: Tensor

    def __init__(
        self,
        cfg: DraftConfig,
        *,
        num_layers: int,
        block_size: int,
        mask_token_id: int,
        embed_weight: Tensor | None = None,
        lm_head: Tensor | None = None,
        sample_from_anchor: bool = False,
    ):
        super().__init__()
        self.cfg, self.block_size, self.mask_token_id = cfg, block_size, mask_token_id
        # the query rows of a block and the first row that drafts: DFlash's B rows [anchor, m x (B-1)] draft from
        # row 1; DSpark's (sample_from_anchor) B - 1 rows [anchor, m x (B-2)] draft from row 0, the anchor's
        self.queries, self.first = (block_size - 1, 0) if sample_from_anchor else (block_size, 1)
        h = cfg.hidden_size
        if cfg.target_hidden_size != h:
            raise DraftConfigError(f"DFlash needs the target's hidden size ({cfg.target_hidden_size}) as its own ({h})")
        self.embed_tokens = nn.Embedding(cfg.vocab_size, h)
        self.embed_tokens.weight.requires_grad_(False)  # frozen: the target's
        if embed_weight is not None:
            self._check_head("embedding", embed_weight)
            self.embed_tokens.weight = nn.Parameter(embed_weight.detach().clone(), requires_grad=False)
        self.fc = nn.Linear(cfg.num_aux * h, h, bias=False)
        self.hidden_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.decoder = [DecoderLayer(cfg) for _ in range(num_layers)]  # a typed view of `layers` (no keys of its own)
        self.layers = nn.ModuleList(self.decoder)
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        head = lm_head.detach().clone() if lm_head is not None else torch.zeros(cfg.vocab_size, h)
        self._check_head("lm_head", head)
        self.register_buffer("lm_head", head, persistent=False)  # the target's, frozen, not exported
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))
        self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)

    def _check_head(self, name: str, weight: Tensor) -> None:
        if tuple(weight.shape) != (self.cfg.vocab_size, self.cfg.hidden_size):
            raise DraftConfigError(
                f"target {name} is {tuple(weight.shape)}, the draft expects ({self.cfg.vocab_size}, "
                f"{self.cfg.hidden_size}) from config.json"
            )

    def set_vocab_map(self, d2t: Tensor, t2d: Tensor) -> None:
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)

    def compile_blocks(self) -> None:
        """torch.compile the per-token parts in place (keys unchanged); attention stays eager."""
        for layer in self.decoder:
            for m in (layer.mlp, layer.input_layernorm, layer.post_attention_layernorm):
                m.compile(dynamic=False)

    def trainable_state_dict(self) -> dict[str, Tensor]:
        """Everything but the frozen embedding (checkpoints reload it from the target)."""
        return {k: v for k, v in self.state_dict().items() if k != "embed_tokens.weight"}

    def context(self, aux_hidden: Tensor) -> Tensor:
        """aux_hidden [L, K, H] -> the context features [L, H] (SGLang's project_target_hidden)."""
        return self.hidden_norm(self.fc(aux_hidden.flatten(1).to(self.fc.weight.dtype)))

    def context_kv(self, features: Tensor, positions: Tensor) -> list[KV]:
        """Each layer's keys and values of context features [L, H] at their positions [L]."""
        cos, sin = rope_cos_sin(self.inv_freq, positions)
        return [layer.self_attn.kv(features, cos, sin) for layer in self.decoder]

    def block_input(self, anchors: Tensor) -> Tensor:
        """Token ids [A, Q] of blocks anchored on the tokens `anchors` [A]: the anchor, then Q - 1 mask tokens."""
        ids = torch.full((len(anchors), self.queries), self.mask_token_id, dtype=torch.long, device=anchors.device)
        ids[:, 0] = anchors
        return ids

    def blocks(self, ids: Tensor, positions: Tensor, ctx: list[KV], mask: Mask) -> Tensor:
        """Blocks' token ids [M] at RoPE positions [M], each layer's context keys/values, mask [M, L + M] ->
        the normed outputs [M, H] (logits: `logits`)."""
        cos, sin = rope_cos_sin(self.inv_freq, positions)
        x = self.embed_tokens(ids).to(self.fc.weight.dtype)  # [M, H], frozen
        for layer, kv in zip(self.decoder, ctx, strict=True):
            x = layer(x, cos, sin, kv, mask)
        return self.norm(x)

    def forward(
        self, aux_hidden: Tensor, positions: Tensor, anchor_ids: Tensor, anchor_positions: Tensor, mask: Mask
    ) -> Tensor:
        """Training's forward over one packed row: aux_hidden [N, K, H_t] and positions [N] of the row (the
        context), blocks anchored on tokens anchor_ids [A] at anchor_positions [A], mask [A*B, N + A*B] (which
        context rows each block sees; loss.block_mask) -> normed outputs [A, Q, H]."""
        b = self.queries
        ctx = self.context_kv(self.context(aux_hidden), positions)
        ids = self.block_input(anchor_ids).flatten()  # [A*B]
        pos = (anchor_positions[:, None] + torch.arange(b, device=positions.device)).flatten()
        return self.blocks(ids, pos, ctx, mask).view(len(anchor_ids), b, -1)

    def logits(self, out: Tensor) -> Tensor:
        """Normed outputs [M, H] -> logits over the whole target vocabulary [M, V] (the target's lm_head)."""
        return out @ self.lm_head.to(out.dtype).T

    def drafting_rows(self, out: Tensor) -> Tensor:
        """A block's outputs [.., Q, H] -> the rows that draft its B - 1 tokens [.., B - 1, H]."""
        return out[..., self.first : self.first + self.block_size - 1, :]

    def step_latents(self, rows: Tensor, prev: Tensor) -> Tensor | None:
        """Drafting rows [A, S, H] and the token before each drafted one [A, S] -> what each step's logits add
        (DSpark's Markov latents); None for DFlash, whose positions are drafted in parallel."""
        return None

    def step_logits(self, rows: Tensor, latent: Tensor | None) -> Tensor:
        """Drafting rows [M, H] and their step_latents [M, r] (or None) -> logits [M, V]."""
        return self.logits(rows)

    def side_loss(self, rows: Tensor, prev: Tensor, accept: Tensor) -> Tensor:
        """An auxiliary loss per drafted position [M] against the probability the drafted token is accepted (DSpark's
        confidence head); DFlash has none."""
        return rows.new_zeros(rows.shape[0], dtype=torch.float32)

    def draft(self, rows: Tensor, anchor: int) -> list[int]:
        """Greedy tokens of one block's drafting rows [n, H] (DSpark: one step at a time, each one's bias from the
        token before it)."""
        return [int(t) for t in self.logits(rows).argmax(-1)]
