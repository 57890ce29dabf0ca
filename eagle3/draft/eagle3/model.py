"""The EAGLE-3 draft (and EAGLE-3.1's, Eagle3Flags), laid out exactly as SGLang's `LlamaForCausalLMEagle3` loads it.
Read top-down.

    fc_norm.{0..K-1}        RMSNorm(H_target) per aux state  EAGLE-3.1 only (fc_norm), before fc
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
    step i, position t: input (embedding of x[t+1+i], the draft's own output of step i-1 at t: pre-norm,
                        or post-norm with EAGLE-3.1's norm_output), RoPE position t+i
    attention of step i at t: step-0 keys of its document at positions <= t (causal), plus the keys of
                        steps 1..i at t only (diagonal): the key/value cache a chained draft would hold.

Logits of step i at t predict x[t+2+i]; eagle3/draft/eagle3/loss.py pairs them with the target distribution.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from eagle3.draft.layers import MLP, AttendFn, RMSNorm, apply_rope, rope_cos_sin, rope_inv_freq
from eagle3.draft.shape import DraftConfig, DraftConfigError


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


@dataclass(frozen=True)
class Eagle3Flags:
    """What EAGLE-3.1 adds to EAGLE-3 (SGLang 0.5.23's llama_eagle3.py reads both from config.json):
    fc_norm      an RMSNorm per aux state (over H_target) before `fc`: weights fc_norm.{0..K-1}.weight
    norm_output  the next step is fed the draft's post-norm state (the one its lm_head reads), not the pre-norm one
    """

    fc_norm: bool = False
    norm_output: bool = False


class Eagle3Draft(nn.Module):
    d2t: Tensor  # buffers, typed for the checker
    t2d: Tensor
    inv_freq: Tensor

    def __init__(self, cfg: DraftConfig, embed_weight: Tensor | None = None, flags: Eagle3Flags = Eagle3Flags()):
        super().__init__()
        self.cfg, self.flags = cfg, flags
        h = cfg.hidden_size
        self.embed_tokens = nn.Embedding(cfg.vocab_size, h)
        self.embed_tokens.weight.requires_grad_(False)  # frozen: the target's
        if embed_weight is not None:
            self.load_embedding(embed_weight)
        self.fc_norm = (
            nn.ModuleList(RMSNorm(cfg.target_hidden_size, cfg.rms_norm_eps) for _ in range(cfg.num_aux))
            if flags.fc_norm
            else None
        )
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
            *(self.fc_norm or ()),
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

    def fuse(self, aux_hidden: Tensor) -> Tensor:
        """aux_hidden [N, K, H_t] -> the first step's hidden state [N, H] (EAGLE-3.1: each aux state normed first)."""
        if self.fc_norm is not None:
            aux_hidden = torch.stack([norm(aux_hidden[:, j]) for j, norm in enumerate(self.fc_norm)], dim=1)
        return self.fc(aux_hidden.flatten(1))

    def head(self, hidden: Tensor) -> tuple[Tensor, Tensor]:
        """A step's output [N, H] -> (its logits [N, draft vocab], the hidden state the next step is fed)."""
        normed = self.norm(hidden)
        return self.lm_head(normed), normed if self.flags.norm_output else hidden

    def forward(
        self, input_ids: Tensor, aux_hidden: Tensor, positions: Tensor, remaining: Tensor, attend: AttendFn, steps: int
    ) -> list[Tensor]:
        """input_ids [N], aux_hidden [N, K, H_t], positions [N] (within the document), remaining [N] (tokens after
        this one in its document). Returns the logits of each TTT step, steps x [N, draft vocab]."""
        n = input_ids.shape[0]
        hidden = self.fuse(aux_hidden)  # [N, H]
        ids_ahead = F.pad(input_ids, (0, steps + 1))  # [N + steps + 1]
        cache: list[tuple[Tensor, Tensor]] = []
        logits = []
        for i in range(steps):
            ids = torch.where(remaining > i, ids_ahead[1 + i : 1 + i + n], 0)  # x[t+1+i], 0 past the document end
            emb = self.embed_tokens(ids)  # [N, H], frozen
            cos, sin = rope_cos_sin(self.inv_freq, positions + i)  # [N, 1, hd]
            out = self.midlayer(emb, hidden, cos, sin, cache, attend)  # [N, H]
            step_logits, hidden = self.head(out)  # [N, draft vocab], [N, H]
            logits.append(step_logits)
        return logits

    def trainable_state_dict(self) -> dict[str, Tensor]:
        """Everything but the frozen embedding (checkpoints reload it from the target)."""
        return {k: v for k, v in self.state_dict().items() if k != "embed_tokens.weight"}
