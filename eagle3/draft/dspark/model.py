"""The DSpark draft: DFlash's backbone (eagle3/draft/dflash/model.py) plus what SGLang 0.5.23's `DSparkDraftModel`
(sglang/srt/models/dspark.py) loads on top, in its key names:

    markov_head.markov_w1       Embedding(V, r)      the previous token's low-rank code
    markov_head.markov_w2       Linear(r -> V)       its bias on the next token's logits ("vanilla" Markov head)
    confidence_head.proj        Linear(H + r -> 1)   with bias: the probability the drafted token is accepted, from
                                                     the drafting row and the previous token's code

Drafting (sample_from_anchor, SGLang's default): the block's B - 1 query rows are [anchor, m x (B-2)]; row j gives
the base logits of x[p+1+j] (the target's lm_head over its output), and the drafted token is the argmax of
base_j + markov_w2(markov_w1[prev_j]), prev_0 = the anchor, prev_j = the token drafted at j - 1: one backbone forward,
then B - 1 cheap sequential steps (semi-autoregressive). The confidence head feeds SGLang's ragged verify (how many
drafted tokens to verify); greedy acceptance does not read it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from eagle3.draft.dflash.model import DFlashDraft
from eagle3.draft.shape import DraftConfig

#: The confidence head's loss weight beside the token loss (our choice; the published mix was not read here).
CONFIDENCE_WEIGHT = 0.1


class MarkovHead(nn.Module):
    def __init__(self, vocab_size: int, rank: int):
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, vocab_size, bias=False)
        nn.init.normal_(self.markov_w1.weight, std=0.02)
        nn.init.zeros_(self.markov_w2.weight)  # starts as DFlash: no bias until trained

    def forward(self, prev: Tensor) -> Tensor:
        return self.markov_w2(self.markov_w1(prev))  # [M, V]


class ConfidenceHead(nn.Module):
    def __init__(self, hidden_size: int, rank: int):
        super().__init__()
        self.proj = nn.Linear(hidden_size + rank, 1, bias=True)

    def forward(self, rows: Tensor, prev_code: Tensor) -> Tensor:
        """The raw confidence logit [M] (SGLang: sigmoid(raw / sts_temperature), temperature 1)."""
        return self.proj(torch.cat([rows, prev_code.to(rows.dtype)], dim=-1).to(self.proj.weight.dtype)).squeeze(-1)


class DSparkDraft(DFlashDraft):
    def __init__(
        self,
        cfg: DraftConfig,
        *,
        num_layers: int,
        block_size: int,
        mask_token_id: int,
        markov_rank: int,
        embed_weight: Tensor | None = None,
        lm_head: Tensor | None = None,
    ):
        super().__init__(cfg, num_layers=num_layers, block_size=block_size, mask_token_id=mask_token_id,
                         embed_weight=embed_weight, lm_head=lm_head, sample_from_anchor=True)  # fmt: skip
        self.markov_rank = markov_rank
        self.markov_head = MarkovHead(cfg.vocab_size, markov_rank)
        self.confidence_head = ConfidenceHead(cfg.hidden_size, markov_rank)

    def step_logits(self, rows: Tensor, prev: Tensor) -> Tensor:
        return self.logits(rows) + self.markov_head(prev).to(rows.dtype)

    def side_loss(self, rows: Tensor, prev: Tensor, hit: Tensor) -> Tensor:
        """The confidence head's binary cross-entropy against whether the step's argmax is the target's token."""
        raw = self.confidence_head(rows, self.markov_head.markov_w1(prev))
        return CONFIDENCE_WEIGHT * F.binary_cross_entropy_with_logits(raw.float(), hit.float(), reduction="none")

    def draft(self, rows: Tensor, anchor: int) -> list[int]:
        out, prev = [], torch.tensor([anchor], device=rows.device)
        base = self.logits(rows)  # [n, V]
        for j in range(rows.shape[0]):
            prev = (base[j : j + 1] + self.markov_head(prev).to(base.dtype)).argmax(-1)
            out.append(int(prev))
        return out
