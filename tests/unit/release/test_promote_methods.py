"""Several methods from one store: the candidate is the draft with the highest modelled speed-up, and a draft of
another method than the current one is compared by modelled speed-up on the same set (acceptance lengths at
different drafting procedures say nothing about speed alone)."""

from __future__ import annotations

from pathlib import Path

import pytest

from eagle3.release.promote import EvalRecord, EvalSet, choose_method, promote

SET = EvalSet(dataset_sha256="e" * 64, num_prompts=20, max_new_tokens=64, draft_steps=3, offline_dtype="float32")


def record(method: str, acceptance: float, modelled: float | None, steps: int = 3) -> EvalRecord:
    return EvalRecord(method=method, eval_set=SET.model_copy(update={"draft_steps": steps}),
                      acceptance_length=acceptance, modelled_speed_up=modelled)  # fmt: skip


def export(run: Path, name: str) -> Path:
    d = run / "draft" / "exports" / name
    d.mkdir(parents=True)
    return d


def test_the_method_with_the_highest_modelled_speed_up_is_the_candidate_with_its_margin() -> None:
    method, why = choose_method({"eagle3": record("eagle3", 2.1, 1.50), "eagle3.1": record("eagle3.1", 2.2, 1.62)})
    assert method == "eagle3.1"
    assert why == "eagle3.1 wins by modelled speed-up (eagle3.1 1.620, eagle3 1.500): +8.0% over eagle3"
    assert choose_method({"eagle3": record("eagle3", 2.1, None)}) == ("eagle3", "eagle3 is the only method trained")


def test_a_draft_of_another_method_is_promoted_only_when_its_modelled_speed_up_is_not_worse(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert promote(run, export(run, "a"), record("eagle3", 2.0, 1.50)).promoted
    slower = promote(run, export(run, "b"), record("eagle3.1", 2.5, 1.40, steps=5))  # more accepted, yet slower
    assert not slower.promoted and slower.method == "eagle3.1"
    assert "modelled speed-up 1.400x (eagle3.1) is below the current eagle3 draft's 1.500x" in slower.reason
    faster = promote(run, export(run, "c"), record("eagle3.1", 1.9, 1.60, steps=5), chosen="eagle3.1 wins")
    assert faster.promoted and faster.chosen == "eagle3.1 wins"
    assert "modelled speed-up 1.600x (eagle3.1) vs the current eagle3 draft's 1.500x" in faster.reason


@pytest.mark.parametrize("modelled", [None, 1.2])
def test_methods_without_a_modelled_speed_up_on_the_same_set_are_not_compared(
    tmp_path: Path, modelled: float | None
) -> None:
    run = tmp_path / "run"
    promote(run, export(run, "a"), record("eagle3", 2.0, None))
    other = record("eagle3.1", 2.5, modelled).model_copy(update={"eval_set": SET.model_copy(update={"num_prompts": 5})})
    d = promote(run, export(run, "b"), other)
    assert not d.promoted and "no modelled speed-up on the same evaluation set" in d.reason
