"""Per-row seeded sampling inside one batched `generate` (transformers engine).

transformers samples a batch with one global random stream, so a sample's tokens would depend on which samples
share its batch (and a resumed run batches differently). RowSampler draws each row's next token itself, from a
torch.Generator seeded per row (eagle3.user_turns.sample_seed), with the row's temperature and the top-p cut,
and leaves only that token possible: `generate` then runs greedy (do_sample=False) and picks it. Rows with
temperature 0 are left alone (greedy), so one batch may hold greedy and sampled rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


class RowSampler:
    """A transformers LogitsProcessor: `sampling[i]` = (temperature, seed) of row i."""

    def __init__(self, sampling: Sequence[tuple[float, int]], top_p: float, device: Any):
        self.temperatures = [t for t, _ in sampling]
        self.top_p = top_p
        dev = torch.device(device)
        self.generators = [torch.Generator(device=dev).manual_seed(seed) if t > 0 else None for t, seed in sampling]

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        out = scores.clone()
        for row, (t, gen) in enumerate(zip(self.temperatures, self.generators, strict=True)):
            if gen is None:
                continue
            probs = torch.softmax(scores[row].float() / t, dim=-1)
            if self.top_p < 1.0:
                sorted_p, order = torch.sort(probs, descending=True)
                drop = torch.cumsum(sorted_p, dim=-1) - sorted_p > self.top_p  # keep the smallest set reaching top_p
                probs = probs.scatter(0, order, sorted_p.masked_fill(drop, 0.0))
            token = torch.multinomial(probs, 1, generator=gen)
            out[row] = torch.finfo(out.dtype).min
            out[row, token] = 0.0
        return out
