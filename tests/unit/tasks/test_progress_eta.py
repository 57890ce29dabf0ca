"""The ETA comes from tokens where the work is measured in tokens (extraction's prefill): a long sample moves it
by its length, not by one sample's share, and skipped or failed samples' tokens are not counted as work left."""

from __future__ import annotations

import logging
from typing import Any
from uuid import UUID, uuid4

import pytest

import tasks.progress as prog
from eagle3.progress import Progress, ProgressCounter, TokenEstimate
from tasks.progress import RunProgressBoard, RunProgressRef


def test_with_a_total_in_tokens_the_eta_is_tokens_left_over_the_token_rate() -> None:
    # 1 of 4 samples done, but it was a short one: 100 of 1000 tokens in 10 s -> 900 tokens at 10 tok/s
    p = Progress("extract", 1, 4, 100, 10.0, total_tokens=1000)
    assert p.eta_s == pytest.approx(90.0)
    assert Progress("extract", 1, 4, 100, 10.0).eta_s == pytest.approx(30.0)  # samples only: 3 x 10 s
    # the samples skipped (already in the store) or failed are not work left
    p = Progress("extract", 3, 4, 100, 10.0, skipped=2, total_tokens=1000, settled_tokens=600)
    assert p.eta_s == pytest.approx(30.0)
    assert Progress("extract", 0, 4, 0, 10.0, total_tokens=1000).eta_s is None  # no rate yet


def test_the_counter_carries_the_settled_tokens_into_its_figures() -> None:
    seen: list[Progress] = []
    c = ProgressCounter("extract", 4, seen.append, every_s=0.0, total_tokens=850)
    c.add(2, skipped=2, settled_tokens=500)
    c.add(tokens=300)
    c.add(failed=1, settled_tokens=50)
    p = c.finish()
    assert (p.done, p.tokens, p.settled_tokens, p.total_tokens) == (4, 300, 550, 850)
    assert p.eta_s == 0.0  # every token is done or settled
    assert seen[0].settled_tokens == 500 and seen[0].total_tokens == 850


def test_generation_has_an_eta_from_its_first_tokens_before_any_sample_finished() -> None:
    # synthesize: 4 samples of at most 2 turns x 64 tokens; 32 tokens generated in 4 s, no sample finished yet
    estimate = TokenEstimate([128, 128, 128, 128])
    assert Progress("synthesize", 0, 4, 32, 4.0, total_tokens=estimate.total()).eta_s == pytest.approx(480 / 8)
    # once samples finish, the rest are estimated at their mean (40 tokens), a failed one at nothing
    estimate.finish(30)
    assert estimate.finish(50) == 80 + 2 * 40
    assert estimate.drop() == 80 + 40
    assert Progress("synthesize", 3, 4, 100, 10.0, failed=1, total_tokens=estimate.total()).eta_s == pytest.approx(2.0)


def test_export_says_no_token_rate_it_does_not_have() -> None:
    assert prog.describe(1, 1, "drafts", None, 0.0) == "1/1 drafts, ETA 0s"


def test_the_run_board_estimates_the_shards_not_reported_yet_at_the_same_tokens_per_sample(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    writes: list[tuple[float, str]] = []

    def update(artifact_id: UUID, progress: float, description: str | None = None) -> UUID:
        writes.append((progress, description or ""))
        return artifact_id

    monkeypatch.setattr(prog, "update_progress_artifact", update)
    board = RunProgressBoard(RunProgressRef(artifact_id=str(uuid4()), total=20), logging.getLogger("t"))
    assert board.tokens_left(0) is None
    # shard 0 (10 samples, 2000 tokens) reported 500 tokens done; shard 1 (10 samples) has not started
    board.shards[0] = Progress("extract", 2, 10, 500, 5.0, total_tokens=2000)
    assert board.tokens_left(500) == 4000 - 500
    board.shards[0] = Progress("extract", 5, 10, 500, 5.0, skipped=3, total_tokens=2000, settled_tokens=700)
    assert board.tokens_left(500) == 4000 - 700 - 500
    board.report(0, board.shards[0])
    text: Any = writes[-1][1]
    assert text.startswith("5/20 samples") and "ETA" in text
