"""The DSpark draft: DFlash's backbone (eagle3/draft/dflash/model.py) plus what SGLang 0.5.23's `DSparkDraftModel`
(sglang/srt/models/dspark.py) loads on top, in its key names:

    markov_head.markov_w1       Embedding(V, r)      the previous token's low-rank code
    markov_head.markov_w2       Linear(r -> V)       the step's latent -> its bias on the next token's logits
    markov_head.gate_proj       Linear(H + r -> r)   "gated" head only: the code gated by the drafting row
    markov_head.joint_proj      Linear(2r + H -> 3r) "rnn" head only: a recurrent state along the block
    confidence_head.proj        Linear(H + r -> 1)   with bias: the probability the drafted token is accepted, from
                                                     the drafting row and the previous token's code

Drafting (sample_from_anchor, SGLang's default): the block's B - 1 query rows are [anchor, m x (B-2)]; row j gives
the base logits of x[p+1+j] (the target's lm_head over its output), and the drafted token is the argmax of
base_j + markov_w2(latent_j), latent_j = markov_w1[prev_j] ("vanilla"; gated or carried through a state by the
other heads, train.markov_head), prev_0 = the anchor, prev_j = the token drafted at j - 1: one backbone forward,
then B - 1 cheap sequential steps (semi-autoregressive). The confidence head feeds SGLang's ragged verify (how many
drafted tokens to verify); greedy acceptance does not read it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from eagle3.draft.dflash.model import DFlashDraft, LossMix
from eagle3.draft.shape import DraftConfig

#: DeepSeek's published mix (DeepSpec, config/dspark/*.py and deepspec/modeling/dspark/loss.py): 0.1 x the
#: cross-entropy, 0.9 x the L1 distance to the target's distribution, 1.0 x the confidence head's BCE against the
#: sampled acceptance rate 1 - TV(draft, target); position weights exp(-p / gamma), gamma 4 for 7 drafted tokens.
PUBLISHED_MIX = LossMix(ce=0.1, l1=0.9, confidence=1.0)


class MarkovHead(nn.Module):
    """SGLang's VanillaMarkov: step j's latent is the previous token's code markov_w1[prev]; its bias on the logits
    markov_w2(latent). Each head's step(prev, row, state) is one drafting step, as SGLang's step_bias runs it."""

    def __init__(self, vocab_size: int, rank: int, hidden_size: int):
        super().__init__()
        self.rank = rank
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, vocab_size, bias=False)
        nn.init.normal_(self.markov_w1.weight, std=0.02)
        nn.init.zeros_(self.markov_w2.weight)  # starts as DFlash: no bias until trained

    def init_state(self, rows: Tensor) -> Tensor | None:
        return None

    def step(self, prev: Tensor, row: Tensor, state: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """prev [n] token ids, row [n, H] the drafting row -> (latent [n, r], the state the next step reads)."""
        return self.markov_w1(prev), state

    def bias(self, latent: Tensor) -> Tensor:
        return self.markov_w2(latent)  # [n, V]


class GatedMarkovHead(MarkovHead):
    """SGLang's GatedMarkovHead: the code gated by sigmoid(gate_proj([row; code]))."""

    def __init__(self, vocab_size: int, rank: int, hidden_size: int):
        super().__init__(vocab_size, rank, hidden_size)
        self.gate_proj = nn.Linear(hidden_size + rank, rank)

    def step(self, prev: Tensor, row: Tensor, state: Tensor | None) -> tuple[Tensor, Tensor | None]:
        code = self.markov_w1(prev)
        gate = torch.sigmoid(self.gate_proj(torch.cat([row.to(code.dtype), code], dim=-1)))
        return gate * code, state


class RNNMarkovHead(MarkovHead):
    """SGLang's RNNHead: a state [n, r] carried along the block from zeros; z = [state; code; row], joint_proj(z)
    -> gate, candidate, output; state' = g * state + (1 - g) * tanh(candidate), latent = tanh(output)."""

    def __init__(self, vocab_size: int, rank: int, hidden_size: int):
        super().__init__(vocab_size, rank, hidden_size)
        self.joint_proj = nn.Linear(2 * rank + hidden_size, 3 * rank)

    def init_state(self, rows: Tensor) -> Tensor | None:
        return rows.new_zeros(rows.shape[0], self.rank, dtype=self.markov_w1.weight.dtype)

    def step(self, prev: Tensor, row: Tensor, state: Tensor | None) -> tuple[Tensor, Tensor | None]:
        assert state is not None, "RNNMarkovHead.step before init_state"
        code = self.markov_w1(prev)
        z = torch.cat([state, code, row.to(code.dtype)], dim=-1)
        gate_raw, candidate_raw, output_raw = self.joint_proj(z).chunk(3, dim=-1)
        gate = torch.sigmoid(gate_raw)
        return torch.tanh(output_raw), gate * state + (1.0 - gate) * torch.tanh(candidate_raw)


#: train.markov_head -> the head (SGLang's markov_head_type of the same name)
MARKOV_HEADS: dict[str, type[MarkovHead]] = {"vanilla": MarkovHead, "gated": GatedMarkovHead, "rnn": RNNMarkovHead}


class ConfidenceHead(nn.Module):
    def __init__(self, hidden_size: int, rank: int):
        super().__init__()
        self.proj = nn.Linear(hidden_size + rank, 1, bias=True)

    def forward(self, rows: Tensor, prev_code: Tensor) -> Tensor:
        """The raw confidence logit [M] (SGLang: sigmoid(raw / sts_temperature), temperature 1)."""
        return self.proj(torch.cat([rows, prev_code.to(rows.dtype)], dim=-1).to(self.proj.weight.dtype)).squeeze(-1)


class DSparkDraft(DFlashDraft):
    loss_mix = PUBLISHED_MIX

    def __init__(
        self,
        cfg: DraftConfig,
        *,
        num_layers: int,
        block_size: int,
        mask_token_id: int,
        markov_rank: int,
        markov_head: str = "vanilla",
        embed_weight: Tensor | None = None,
        lm_head: Tensor | None = None,
    ):
        super().__init__(cfg, num_layers=num_layers, block_size=block_size, mask_token_id=mask_token_id,
                         embed_weight=embed_weight, lm_head=lm_head, sample_from_anchor=True)  # fmt: skip
        self.markov_rank = markov_rank
        self.markov_head = MARKOV_HEADS[markov_head](cfg.vocab_size, markov_rank, cfg.hidden_size)
        self.confidence_head = ConfidenceHead(cfg.hidden_size, markov_rank)

    def step_latents(self, rows: Tensor, prev: Tensor) -> Tensor:
        """Drafting rows [A, S, H] and the token before each drafted one [A, S] (teacher-forced in training) -> each
        step's Markov latent [A, S, r], step by step along the block as SGLang drafts (cheap: r-wide)."""
        state, out = self.markov_head.init_state(rows[:, 0]), []
        for j in range(rows.shape[1]):
            latent, state = self.markov_head.step(prev[:, j], rows[:, j], state)
            out.append(latent)
        return torch.stack(out, dim=1)

    def step_logits(self, rows: Tensor, latent: Tensor | None) -> Tensor:
        assert latent is not None, "DSpark's step logits need step_latents"
        return self.logits(rows) + self.markov_head.bias(latent).to(rows.dtype)

    def side_loss(self, rows: Tensor, prev: Tensor, accept: Tensor) -> Tensor:
        """The confidence head's binary cross-entropy against the step's acceptance rate (DeepSpec's target)."""
        raw = self.confidence_head(rows, self.markov_head.markov_w1(prev))
        return F.binary_cross_entropy_with_logits(raw.float(), accept.float(), reduction="none")

    def draft(self, rows: Tensor, anchor: int) -> list[int]:
        out, prev = [], torch.tensor([anchor], device=rows.device)
        base = self.logits(rows)  # [n, V]
        state = self.markov_head.init_state(rows[:1])
        for j in range(rows.shape[0]):
            latent, state = self.markov_head.step(prev, rows[j : j + 1], state)
            prev = (base[j : j + 1] + self.markov_head.bias(latent).to(base.dtype)).argmax(-1)
            out.append(int(prev))
        return out
