"""The held-out slice of the store: which samples the trainer never trains on, and how they are measured.

    split_heldout(samples, fraction, index[, data_fraction]) -> (train, heldout)   a sample's side: its id alone
    heldout_rows(heldout, batch_tokens, max)  -> rows of samples       the measured ones, packed, in index order
    HeldoutTally                                                       sums per checkpoint -> the "heldout" record

A sample is held out when sha256 of its source's id (eagle3/store/sample_ids.py: every synthesized answer to one prompt
has the same), read as a number in [0, 1), is below train.heldout_fraction: all answers to a prompt fall on one
side, so the held-out figure measures prompts the draft never trained on; the split is the same on resume, in
every process, and when the store grows (a sample never moves between the two sides; a larger fraction only adds
held-out samples). The trainer measures the held-out rows at every checkpoint with its own TTT forward and loss
(the method's, no gradient): per-TTT-step accuracy and the teacher-forced acceptance length of a k-step
chain (`chain_acceptance`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from eagle3.draft.data import DataError, Sample
from eagle3.draft.distill import DraftLoss, chain_acceptance
from eagle3.store.sample_ids import source_of

#: The split rule, recorded in every checkpoint: a training whose checkpoints lack it chose its held-out samples by
#: their own id (before this rule), and resuming it here would train on prompts it holds out.
SPLIT_RULE = "by-prompt"


def heldout_score(sample_id: str) -> float:
    """sha256 of the sample's source id as a number in [0, 1): the same on every machine and in every process,
    and for every answer to one prompt."""
    return int.from_bytes(hashlib.sha256(source_of(sample_id).encode()).digest()[:8], "big") / 2**64


def is_heldout(sample_id: str, fraction: float) -> bool:
    return heldout_score(sample_id) < fraction


def split_heldout(
    samples: list[Sample], fraction: float, index: Path, data_fraction: float = 1.0
) -> tuple[list[Sample], list[Sample]]:
    """(training samples, held-out samples), each in index order. fraction 0: none held out. data_fraction < 1
    trains on the samples whose score lies in the first data_fraction of the range above `fraction`: nested (a
    smaller fraction's samples are in every larger one's), never a held-out sample."""
    if fraction <= 0 and data_fraction >= 1:
        return samples, []
    heldout = [s for s in samples if is_heldout(s.sample_id, fraction)]
    rest = [s for s in samples if not is_heldout(s.sample_id, fraction)]
    if fraction > 0 and not heldout:
        raise DataError(
            f"{index}: train.heldout_fraction={fraction} holds out none of its {len(samples)} samples; raise the "
            "fraction or add data (or set train.heldout_fraction: 0 and train.select: last)"
        )
    if not rest:
        raise DataError(
            f"{index}: train.heldout_fraction={fraction} holds out all {len(samples)} samples, leaving none to "
            "train on; lower the fraction or add data"
        )
    cut = fraction + (1.0 - fraction) * data_fraction
    train = rest if data_fraction >= 1 else [s for s in rest if heldout_score(s.sample_id) < cut]
    if not train:
        raise DataError(
            f"{index}: train.data_fraction={data_fraction} keeps none of its {len(rest)} training samples; raise "
            "the fraction or add data"
        )
    return train, heldout


def heldout_rows(heldout: list[Sample], batch_tokens: int, max_tokens: int) -> list[list[Sample]]:
    """The measured held-out samples (the first ones in index order while their tokens stay within max_tokens; at
    least one), packed in that order into rows of at most batch_tokens (a longer sample: a row of its own, whole,
    eagle3.draft.data.read_row)."""
    rows: list[list[Sample]] = []
    used, room = 0, 0
    for s in heldout:
        n = s.num_tokens
        if rows and used + n > max_tokens:
            break
        used += n
        if not rows or n > room:
            rows.append([])
            room = batch_tokens
        rows[-1].append(s)
        room -= n
    return rows


@dataclass
class HeldoutTally:
    """Sums over the held-out rows of one checkpoint; `record` is what state.json and metrics.jsonl hold."""

    k: int
    hits: torch.Tensor | None = None  # [S]
    labels: torch.Tensor | None = None  # [S]
    accept: float = 0.0
    positions: float = 0.0
    loss: list[float] = field(default_factory=list)
    tokens: int = 0

    def add(self, out: DraftLoss, tokens: int) -> None:
        hits, labels = out.step_hits.double().cpu(), out.step_labels.double().cpu()
        self.hits = hits if self.hits is None else self.hits + hits
        self.labels = labels if self.labels is None else self.labels + labels
        a, n = chain_acceptance(out, self.k)
        self.accept += float(a)
        self.positions += float(n)
        self.loss.append(float(out.total.detach()))
        self.tokens += tokens

    def record(self) -> dict[str, Any]:
        assert self.hits is not None and self.labels is not None, "no held-out row was measured"
        return {
            "acc": [h / max(1.0, n) for h, n in zip(self.hits.tolist(), self.labels.tolist(), strict=True)],
            "acceptance_length": self.accept / max(1.0, self.positions),
            "k": self.k,
            "loss": sum(self.loss) / len(self.loss),
            "tokens": self.tokens,
            "positions": int(self.positions),
        }
