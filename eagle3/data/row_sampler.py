"""Per-row seeded sampling inside one batched `generate` (transformers engine).

transformers samples a batch with one global random stream, so a sample's tokens would depend on which samples
share its batch (and a resumed run batches differently). RowSampler draws each row's next token itself, from a
uniform number that only the row's seed (eagle3.data.user_turns.sample_seed) and the decode step give, with the row's
temperature and the top-p cut, and leaves only that token possible: `generate` then runs greedy (do_sample=False)
and picks it. Rows with temperature 0 are left alone (greedy), so one batch may hold greedy and sampled rows.

The draw is one batched inverse-CDF lookup for all sampled rows (sorted probabilities, their cumulative sum,
`searchsorted`), the uniforms a counter-based hash (splitmix64 of seed and step) computed on the device: a handful
of kernels per decode step whatever the batch, where a torch.Generator per row launched several per row (on an
H200 that loop, not the model, set the speed of a 1,024-row batch).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import LogitsProcessor

_MASK64 = (1 << 64) - 1


def _signed(x: int) -> int:
    """A 64-bit pattern as the int64 that holds it."""
    x &= _MASK64
    return x - (1 << 64) if x >= 1 << 63 else x


_GOLDEN, _MIX1, _MIX2 = (_signed(c) for c in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB))


def _shr(z: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns (torch's >> is arithmetic)."""
    return (z >> k) & ((1 << (64 - k)) - 1)


def uniforms(seeds: torch.Tensor, step: int) -> torch.Tensor:
    """One float64 in [0, 1) per seed for decode step `step`: splitmix64 of (seed, step), int64 arithmetic that
    wraps the same way on every device."""
    z = seeds ^ _signed((step + 1) * 0x9E3779B97F4A7C15)
    z = z + _GOLDEN
    z = (z ^ _shr(z, 30)) * _MIX1
    z = (z ^ _shr(z, 27)) * _MIX2
    z = z ^ _shr(z, 31)
    return _shr(z, 11).double() * (1.0 / (1 << 53))


class RowSampler(LogitsProcessor):
    """A transformers LogitsProcessor: `sampling[i]` = (temperature, seed) of row i."""

    def __init__(self, sampling: Sequence[tuple[float, int]], top_p: float, device: Any):
        dev = torch.device(device)
        rows = [i for i, (t, _) in enumerate(sampling) if t > 0]
        self.top_p = top_p
        self.rows = torch.tensor(rows, dtype=torch.long, device=dev)
        self.temps = torch.tensor([sampling[i][0] for i in rows], dtype=torch.float32, device=dev).unsqueeze(1)
        self.seeds = torch.tensor([_signed(sampling[i][1]) for i in rows], dtype=torch.long, device=dev)
        self.step = 0  # generate calls once per new token: the row's position in its answer

    def keep(self, rows: torch.Tensor) -> None:
        """The batch now holds only `rows` (ascending indices into it; eagle3.data.decode_loop drops finished rows):
        the sampled rows among them keep their seeds and temperatures, and the step count goes on."""
        kept = torch.isin(self.rows, rows)
        self.rows = torch.searchsorted(rows, self.rows[kept])
        self.temps, self.seeds = self.temps[kept], self.seeds[kept]

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        step, self.step = self.step, self.step + 1
        if not len(self.rows):
            return scores
        probs = torch.softmax(scores[self.rows].float() / self.temps, dim=-1)  # [R, V]
        sorted_p, order = torch.sort(probs, descending=True, dim=-1, stable=True)
        drop = torch.cumsum(sorted_p, dim=-1) - sorted_p > self.top_p  # keep the smallest set reaching top_p
        cdf = torch.cumsum(sorted_p.masked_fill(drop, 0.0).double(), dim=-1)
        target = uniforms(self.seeds, step) * cdf[:, -1]
        pick = torch.searchsorted(cdf, target.unsqueeze(1), right=True).squeeze(1)
        pick = torch.minimum(pick, (~drop).sum(-1) - 1)  # rounding at the top end stays inside the nucleus
        tokens = order.gather(1, pick.unsqueeze(1)).squeeze(1)
        out = scores.clone()
        out[self.rows] = torch.finfo(out.dtype).min
        out[self.rows, tokens] = 0.0
        return out
