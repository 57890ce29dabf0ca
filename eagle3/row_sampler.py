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
from transformers import LogitsProcessor


class RowSampler(LogitsProcessor):
    """A transformers LogitsProcessor: `sampling[i]` = (temperature, seed) of row i."""

    def __init__(self, sampling: Sequence[tuple[float, int]], top_p: float, device: Any):
        self.temperatures = [t for t, _ in sampling]
        self.top_p = top_p
        dev = torch.device(device)
        self.generators = [torch.Generator(device=dev).manual_seed(seed) if t > 0 else None for t, seed in sampling]

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        rows = [i for i, g in enumerate(self.generators) if g is not None]
        if not rows:
            return scores
        index = torch.tensor(rows, device=scores.device)
        temps = torch.tensor([self.temperatures[i] for i in rows], device=scores.device).unsqueeze(1)
        probs = torch.softmax(scores[index].float() / temps, dim=-1)  # the sampled rows, at once
        if self.top_p < 1.0:
            sorted_p, order = torch.sort(probs, descending=True, dim=-1)
            drop = torch.cumsum(sorted_p, dim=-1) - sorted_p > self.top_p  # keep the smallest set reaching top_p
            probs = probs.scatter(1, order, sorted_p.masked_fill(drop, 0.0))
        out = scores.clone()
        for j, row in enumerate(rows):  # only the draw is per row: each row's own generator
            token = torch.multinomial(probs[j], 1, generator=self.generators[row])
            out[row] = torch.finfo(out.dtype).min
            out[row, token] = 0.0
        return out
