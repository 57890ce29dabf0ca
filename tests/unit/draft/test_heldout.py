"""The held-out split, the chain acceptance it is measured by, and best-checkpoint selection (checkpoints/best.json)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from eagle3.config import TrainConfig
from eagle3.draft.checkpoint import (
    FILES,
    best_checkpoint,
    read_best,
    resolve_checkpoint,
    select_best,
    step_dir,
)
from eagle3.draft.data import DataError, Sample
from eagle3.draft.distill import DraftLoss, chain_acceptance
from eagle3.draft.heldout import heldout_rows, heldout_score, split_heldout
from eagle3.store.fsio import atomic_write_json
from eagle3.store.sample_ids import sample_keys, source_of

INDEX = Path("run/index.arrow")


def samples(n: int, start: int = 0) -> list[Sample]:
    return [Sample(Path(f"s{i}.safetensors"), 10 + i % 7, f"sample-{i:05d}") for i in range(start, start + n)]


def ids(xs: list[Sample]) -> list[str]:
    return [s.sample_id for s in xs]


def test_the_split_is_disjoint_complete_stable_and_survives_growth_of_the_store() -> None:
    store = samples(2000)
    train, held = split_heldout(store, 0.05, INDEX)
    assert set(ids(train)).isdisjoint(ids(held)) and sorted(ids(train) + ids(held)) == sorted(ids(store))
    assert 50 <= len(held) <= 150  # ~5% of 2000
    assert split_heldout(list(store), 0.05, INDEX) == (train, held)  # another process, another call: the same
    grown_train, grown_held = split_heldout(samples(1000, start=2000) + store, 0.05, INDEX)  # new samples, any order
    assert set(ids(held)) <= set(ids(grown_held)) and set(ids(train)) <= set(ids(grown_train))
    _, more = split_heldout(store, 0.2, INDEX)  # a larger fraction only adds held-out samples
    assert set(ids(held)) <= set(ids(more))
    assert ids(held) == [s.sample_id for s in store if heldout_score(s.sample_id) < 0.05]  # index order kept
    assert split_heldout(store, 0.0, INDEX) == (store, [])


def test_every_answer_to_one_prompt_is_on_the_same_side_of_the_split_and_of_the_data_fraction() -> None:
    # synthesize.samples_per_prompt = 3: a prompt's answers are <id>, <id>.s1, <id>.s2 (eagle3/store/sample_ids.py); a
    # held-out answer whose sibling was trained on would measure a prompt the draft has seen
    store = [
        Sample(Path(f"{k}.safetensors"), 10, key)
        for i in range(600)
        for k, key in enumerate(sample_keys(f"prompt-{i:04d}", 3))
    ]
    train, held = split_heldout(store, 0.1, INDEX)
    assert 20 <= len(held) // 3 <= 100 and len(held) % 3 == 0
    assert {source_of(s) for s in ids(held)}.isdisjoint(source_of(s) for s in ids(train))
    half, _ = split_heldout(store, 0.1, INDEX, data_fraction=0.5)
    assert len(half) % 3 == 0 and 0 < len(half) < len(train)  # the data-size curve keeps or drops whole prompts
    assert source_of("ab12.s7") == "ab12" and source_of("ab12.s0") == "ab12.s0" and source_of("a.s1x") == "a.s1x"


def test_a_fraction_that_leaves_no_training_or_no_heldout_sample_is_an_error_naming_the_key() -> None:
    few = samples(3)
    with pytest.raises(DataError, match=r"run/index.arrow: train.heldout_fraction=1e-09 holds out none of its 3"):
        split_heldout(few, 1e-9, INDEX)
    everything = max(heldout_score(s.sample_id) for s in few) + 1e-12
    with pytest.raises(DataError, match=r"holds out all 3 samples, leaving none to train on"):
        split_heldout(few, everything, INDEX)


def test_select_best_needs_a_heldout_fraction() -> None:
    with pytest.raises(ValidationError, match=r"train.select: best needs held-out samples"):
        TrainConfig(select="best")
    assert TrainConfig(select="best", heldout_fraction=0.02).select == "best"
    assert TrainConfig().heldout_fraction == 0.0 and TrainConfig().select == "last"  # off by default


def test_heldout_rows_stay_within_the_token_budget_in_index_order() -> None:
    held = [Sample(Path(f"{i}"), n, f"id{i}") for i, n in enumerate([30, 50, 40, 200, 10])]
    rows = heldout_rows(held, batch_tokens=100, max_tokens=125)
    assert [[s.sample_id for s in r] for r in rows] == [["id0", "id1"], ["id2"]]  # 30+50+40 = 120 <= 125
    assert heldout_rows(held[3:], batch_tokens=100, max_tokens=10) == [[held[3]]]  # at least one sample (whole)
    assert heldout_rows(held, batch_tokens=100, max_tokens=1000) == [held[:2], [held[2]], [held[3]], [held[4]]]


def test_chain_acceptance_equals_counting_each_positions_leading_correct_steps() -> None:
    g = torch.Generator().manual_seed(0)
    s, n = 5, 300
    labelled = torch.rand(s, n, generator=g) < 0.8
    correct = (torch.rand(s, n, generator=g) < 0.7) & labelled
    out = DraftLoss(torch.zeros(()), torch.zeros(s), correct.sum(1).float(), labelled.sum(1).float(), correct, labelled)
    for k in (1, 3, 5):
        total, count = 0, 0
        for t in range(n):
            if not labelled[0, t]:
                continue
            run = 0
            while run < k and correct[run, t]:
                run += 1
            total, count = total + 1 + run, count + 1
        a, c = chain_acceptance(out, k)
        assert (float(a), float(c)) == (total, count)


def fake_checkpoint(root: Path, step: int, acceptance: float | None) -> Path:
    """A complete step directory (every file present) whose state.json records `acceptance`."""
    d = step_dir(root, step)
    d.mkdir(parents=True)
    for f in FILES:
        (d / f).write_bytes(b"x")
    state: dict[str, object] = {"step": step}
    if acceptance is not None:
        state["heldout"] = {"acc": [0.5], "acceptance_length": acceptance, "k": 3, "tokens": 100}
    atomic_write_json(d / "state.json", state)
    return d


def test_best_is_the_highest_heldout_acceptance_and_resolve_checkpoint_takes_it(tmp_path: Path) -> None:
    root = tmp_path / "train" / "checkpoints"
    fake_checkpoint(root, 100, 1.5)
    best = fake_checkpoint(root, 200, 1.8)
    fake_checkpoint(root, 300, 1.8)  # equal: the earlier stays best
    last = fake_checkpoint(root, 400, 1.2)  # a later, worse one
    atomic_write_json(root / "latest.json", {"step": 400, "dir": last.name})
    assert resolve_checkpoint(tmp_path / "train") == last  # no best.json: select = last
    assert select_best(root) == best
    assert read_best(root) == (200, best)
    assert resolve_checkpoint(tmp_path / "train") == best == resolve_checkpoint(root)
    assert resolve_checkpoint(last) == last  # a step directory named explicitly is taken as it is


def test_a_best_json_whose_directory_went_is_replaced_by_the_best_complete_one(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    fake_checkpoint(root, 100, 1.3)
    second = fake_checkpoint(root, 200, 1.6)
    atomic_write_json(root / "best.json", {"step": 300, "dir": "step-00000300", "acceptance_length": 2, "k": 3})
    (root / ".step-00000300.tmp").mkdir()  # killed while rewriting it
    assert best_checkpoint(root) == second
    assert select_best(root) == second and read_best(root) == (200, second)
    fake_checkpoint(root, 300, None)  # a checkpoint without held-out metrics is never the best
    assert select_best(root) == second


def test_data_fractions_are_nested_subsets_of_the_training_side_and_never_hold_out_samples() -> None:
    store = samples(4000)
    full, held = split_heldout(store, 0.05, INDEX)
    quarter, held_q = split_heldout(store, 0.05, INDEX, data_fraction=0.25)
    half, _ = split_heldout(store, 0.05, INDEX, data_fraction=0.5)
    assert held_q == held  # the held-out side does not move
    assert set(ids(quarter)) < set(ids(half)) < set(ids(full))
    assert 0.2 < len(quarter) / len(full) < 0.3 and 0.45 < len(half) / len(full) < 0.55
    assert ids(quarter) == [s.sample_id for s in full if s in quarter]  # index order kept
    plain_half, none_held = split_heldout(store, 0.0, INDEX, data_fraction=0.5)
    assert none_held == [] and 0.45 < len(plain_half) / len(store) < 0.55
    with pytest.raises(DataError, match=r"train.data_fraction=1e-09 keeps none of its 3 training samples"):
        split_heldout(samples(3), 0.0, INDEX, data_fraction=1e-9)
