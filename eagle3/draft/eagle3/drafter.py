"""EAGLE-3's (and EAGLE-3.1's) drafting procedure for the offline evaluator: a chain of k tokens, one draft forward
per token, with the same inputs as training's TTT (eagle3/draft/eagle3/model.py). The evaluator
(eagle3/evaluate/speculative.py) verifies what it proposes against the target, as for every method.
"""

from __future__ import annotations

import torch
from torch import Tensor

from eagle3.draft.eagle3.model import Eagle3Draft
from eagle3.draft.layers import DraftKV, rope_cos_sin


class EagleDrafter:
    """The EAGLE-3 draft decoding a chain, with the same inputs as training's TTT (eagle3/draft/eagle3/model.py):
    step 0 at position t takes (embedding of x[t+1], fc(aux[t])) at RoPE position t; chain step i takes the
    embedding of its previous draft token and the previous step's hidden state (Eagle3Draft.head: pre-norm, or
    post-norm for EAGLE-3.1) at RoPE position t+i."""

    def __init__(self, draft: Eagle3Draft):
        self.draft = draft
        self.dtype = draft.fc.weight.dtype
        self.kv = DraftKV()
        self.pos = -1  # last position with a step-0 entry
        self.hidden: Tensor | None = None  # [1, H] step-0 output there: predicts the next token

    def _layer(self, tokens: Tensor, hidden: Tensor, positions: Tensor) -> Tensor:
        d = self.draft
        cos, sin = rope_cos_sin(d.inv_freq, positions)  # [m, 1, hd]
        return d.midlayer(d.embed_tokens(tokens), hidden, cos, sin, [], self.kv.attend)  # [m, H]

    def start(self, tokens: list[int], aux: Tensor) -> None:
        self.kv, self.pos = DraftKV(), -1
        self.commit(tokens[1:], aux)

    def commit(self, tokens: list[int], aux: Tensor) -> None:
        dev = self.draft.fc.weight.device
        m = len(tokens)
        positions = torch.arange(self.pos + 1, self.pos + 1 + m, device=dev)
        hidden = self.draft.fuse(aux.to(dev, self.dtype))  # [m, H]
        ids = torch.tensor(tokens, dtype=torch.long, device=dev)  # x[t+1] for t in positions
        self.hidden = self._layer(ids, hidden, positions)[-1:]  # [1, H]
        self.pos += m

    def chain(self, n: int) -> list[Tensor]:
        """Logits [draft vocab] of n chained steps from the last committed position, each step fed the previous
        step's argmax; the cache is left as it was."""
        assert self.hidden is not None, "chain before start"
        d, keep, h = self.draft, len(self.kv), self.hidden
        logits: list[Tensor] = []
        for i in range(n):
            step_logits, fed = d.head(h)  # [1, draft vocab], [1, H]
            logits.append(step_logits[0])
            if i + 1 < n:
                draft_id = int(logits[-1].argmax())
                ids = (d.d2t[draft_id] + draft_id).view(1)  # draft id -> target id
                h = self._layer(ids, fed, torch.tensor([self.pos + 1 + i], device=h.device))
        self.kv.crop(keep)  # chain entries are discarded; the accepted tokens come back through commit
        return logits

    def propose(self, n: int) -> list[int]:
        ids = [int(x.argmax()) for x in self.chain(n)]
        return [i + int(self.draft.d2t[i]) for i in ids]
