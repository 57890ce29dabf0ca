"""draft/current moves only to a draft whose evaluation is not worse on the same set; the pointer is replaced
atomically; every decision says why."""

from __future__ import annotations

import os
from pathlib import Path

from eagle3.release.promote import (
    EvalRecord,
    EvalSet,
    SetRecord,
    current_link,
    point,
    pointed,
    promote,
    read_evaluation,
)

SET = EvalSet(dataset_sha256="e" * 64, num_prompts=20, max_new_tokens=64, draft_steps=3, offline_dtype="float32")


def record(acceptance: float, live: float | None = None, **eval_set: object) -> EvalRecord:
    return EvalRecord(
        eval_set=SET.model_copy(update=eval_set),
        acceptance_length=acceptance,
        live_speed_up=live,
        live_device="cpu" if live is not None else None,
        flagged=live is not None and live < 1.0,
    )


def export(run: Path, name: str) -> Path:
    d = run / "draft" / "exports" / name
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    return d


def test_the_first_draft_is_promoted_a_worse_one_kept_and_a_better_one_moved(tmp_path: Path) -> None:
    a, b, c = export(tmp_path, "a"), export(tmp_path, "b"), export(tmp_path, "c")
    first = promote(tmp_path, a, record(1.50))
    assert first.promoted and "no current draft" in first.reason and pointed(current_link(tmp_path)) == a.resolve()
    worse = promote(tmp_path, b, record(1.40))
    assert not worse.promoted and "1.400 is worse than the current draft's 1.500" in worse.reason
    assert pointed(current_link(tmp_path)) == a.resolve() and read_evaluation(b) == record(1.40)
    better = promote(tmp_path, c, record(1.60))
    assert better.promoted and better.previous == str(a.resolve()) and pointed(current_link(tmp_path)) == c.resolve()
    assert os.readlink(current_link(tmp_path)) == "exports/c"  # relative: the run directory may move


def test_a_slower_live_draft_is_kept_even_with_better_acceptance_and_a_tolerance_allows_a_small_shortfall(
    tmp_path: Path,
) -> None:
    a, b, c = export(tmp_path, "a"), export(tmp_path, "b"), export(tmp_path, "c")
    promote(tmp_path, a, record(1.5, live=1.8))
    slower = promote(tmp_path, b, record(1.6, live=1.5))
    assert not slower.promoted and "live speed-up 1.50x is worse than the current draft's 1.80x" in slower.reason
    assert promote(tmp_path, c, record(1.49, live=1.79), tolerance=0.02).promoted


def test_another_evaluation_set_is_not_compared_and_the_reason_names_the_key(tmp_path: Path) -> None:
    a, b = export(tmp_path, "a"), export(tmp_path, "b")
    promote(tmp_path, a, record(1.5))
    d = promote(tmp_path, b, record(2.0, num_prompts=5))
    assert not d.promoted and "num_prompts: 20 -> 5" in d.reason and "evaluate.promote=always" in d.reason
    assert promote(tmp_path, b, record(2.0, num_prompts=5), policy="always").promoted


def test_a_draft_that_slows_serving_is_never_promoted_when_fail_on_slowdown_is_on(tmp_path: Path) -> None:
    a = export(tmp_path, "a")
    d = promote(tmp_path, a, record(2.0, live=0.8), block_flagged=True)
    assert not d.promoted and "slows serving" in d.reason and pointed(current_link(tmp_path)) is None
    assert promote(tmp_path, a, record(2.0, live=0.8), block_flagged=False).promoted


def test_the_pointer_is_replaced_by_rename_never_removed(tmp_path: Path) -> None:
    a, b = export(tmp_path, "a"), export(tmp_path, "b")
    link = current_link(tmp_path)
    point(link, a)
    inode = os.lstat(link).st_ino
    point(link, b)
    assert os.readlink(link) == "exports/b" and os.lstat(link).st_ino != inode
    assert [p.name for p in link.parent.iterdir() if p.name.startswith(".")] == []  # no temporary link left


def named(sets: dict[tuple[str, int], float], sha: str = "e" * 64) -> EvalRecord:
    """A record with named sets at chain lengths, (name, k) -> acceptance length; the first is the primary."""
    rows = [
        SetRecord(
            name=n, eval_set=SET.model_copy(update={"draft_steps": k, "dataset_sha256": sha}), acceptance_length=a
        )
        for (n, k), a in sets.items()
    ]
    return EvalRecord(eval_set=rows[0].eval_set, acceptance_length=rows[0].acceptance_length, sets=rows)


def test_promotion_compares_every_same_named_set_and_chain_length_and_names_the_worse_one(tmp_path: Path) -> None:
    a, b, c = export(tmp_path, "a"), export(tmp_path, "b"), export(tmp_path, "c")
    promote(tmp_path, a, named({("varied", 3): 1.50, ("humaneval", 3): 1.40, ("humaneval", 5): 1.45}))
    # better on the first set, worse on humaneval at k=5: kept, and the reason names that set and k
    kept = promote(tmp_path, b, named({("varied", 3): 1.60, ("humaneval", 3): 1.41, ("humaneval", 5): 1.30}))
    assert not kept.promoted and "on set humaneval (k=5)" in kept.reason and "1.300" in kept.reason
    assert "varied" not in kept.reason  # only the sets where it is worse
    # not worse on every set both have; a set only the new draft has is listed as not compared
    moved = promote(tmp_path, c, named({("varied", 3): 1.50, ("humaneval", 5): 1.45, ("new-set", 3): 1.0}))
    assert moved.promoted and pointed(current_link(tmp_path)) == c.resolve()
    assert "varied (k=3) 1.500 vs 1.500" in moved.reason and "humaneval (k=5) 1.450 vs 1.450" in moved.reason
    assert "not compared" in moved.reason and "new-set" in moved.reason


def test_sets_with_the_same_name_but_other_contents_are_not_compared(tmp_path: Path) -> None:
    a, b = export(tmp_path, "a"), export(tmp_path, "b")
    promote(tmp_path, a, named({("varied", 3): 1.50}))
    other = promote(tmp_path, b, named({("varied", 3): 2.0}, sha="f" * 64))  # the file changed
    assert not other.promoted and "not comparable" in other.reason and "dataset_sha256" in other.reason
