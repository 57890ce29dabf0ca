"""Draft vocabulary map: frequency order, d2t/t2d agreement, coverage, fill rule, skip-when-unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from eagle3.config import PipelineConfig
from eagle3.convert import ConvertError, convert, read_vocab_map, select_vocab
from eagle3.store.paths import CONVERT_FILE
from tests.unit.convert.convert_fixtures import make_store

# loss-masked counts: 7 x5, 3 x4, 9 x4, 1 x2, 50 x1 (16 tokens); 60 appears often but never loss-masked
SAMPLES = [
    ([60, 60, 7, 7, 3], [0, 0, 1, 1, 1]),
    ([60, 9, 9, 7, 1], [0, 1, 1, 1, 1]),
    ([60, 60, 60, 3, 3, 9], [0, 0, 0, 1, 1, 1]),
    ([7, 7, 3, 9, 1, 50], [1, 1, 1, 1, 1, 1]),
    ([60, 60], [0, 0]),
]


def _cfg(root: Path, draft: int) -> PipelineConfig:
    return PipelineConfig.model_validate({"run_dir": str(root), "train": {"draft_vocab_size": draft}})


def test_arange_plus_d2t_gives_the_selected_ids_most_frequent_first_ties_by_id(tmp_path: Path) -> None:
    store = make_store(tmp_path / "run", SAMPLES)
    res = convert(_cfg(store.root, 3), store)
    d2t, t2d, meta = read_vocab_map(Path(res.vocab_map_path))
    assert d2t.dtype == torch.int64 and t2d.dtype == torch.bool and t2d.shape == (64,)
    assert (torch.arange(3) + d2t).tolist() == [7, 3, 9]  # 3 and 9 tie at 4: lower id first
    assert t2d.nonzero().flatten().tolist() == [3, 7, 9]
    assert res.num_loss_tokens == 16 and res.distinct_tokens == 5
    assert res.coverage == pytest.approx(13 / 16)
    assert meta["covered_tokens"] == "13" and meta["loss_tokens"] == "16"


def test_fewer_distinct_tokens_than_the_draft_fill_with_unseen_ids_in_id_order(tmp_path: Path) -> None:
    store = make_store(tmp_path / "run", SAMPLES)
    res = convert(_cfg(store.root, 8), store)
    d2t, t2d, _ = read_vocab_map(Path(res.vocab_map_path))
    assert (torch.arange(8) + d2t).tolist() == [7, 3, 9, 1, 50, 0, 2, 4]
    assert int(t2d.sum()) == 8 and res.coverage == 1.0


def test_draft_size_is_capped_at_the_target_vocabulary(tmp_path: Path) -> None:
    store = make_store(tmp_path / "run", SAMPLES, vocab=64)
    res = convert(_cfg(store.root, 32000), store)
    d2t, t2d, _ = read_vocab_map(Path(res.vocab_map_path))
    assert res.draft_vocab_size == 64 == d2t.numel() and bool(t2d.all())
    assert sorted((torch.arange(64) + d2t).tolist()) == list(range(64))


def test_select_vocab_matches_a_brute_force_ranking() -> None:
    counts = torch.tensor([0, 5, 2, 5, 0, 9, 1, 2], dtype=torch.int64)
    vm = select_vocab(counts, 5)
    expect = sorted(range(8), key=lambda i: (-int(counts[i]), i))[:5]
    assert vm.selected.tolist() == expect == [5, 1, 3, 2, 7]
    assert vm.covered_tokens == 23 and vm.loss_tokens == 24


def test_convert_skips_when_inputs_are_unchanged_and_redoes_when_they_change(tmp_path: Path) -> None:
    store = make_store(tmp_path / "run", SAMPLES)
    first = convert(_cfg(store.root, 3), store)
    again = convert(_cfg(store.root, 3), store)
    assert not first.skipped and again.skipped and again.fingerprint == first.fingerprint
    other = convert(_cfg(store.root, 4), store)  # draft size is part of the key
    assert not other.skipped and other.draft_vocab_size == 4
    (store.root / "index.arrow").unlink()  # a missing output is rebuilt, not replayed
    assert not convert(_cfg(store.root, 4), store).skipped
    assert (store.root / CONVERT_FILE).is_file()


def test_a_token_id_outside_the_target_vocabulary_names_the_file(tmp_path: Path) -> None:
    store = make_store(tmp_path / "run", [([1, 2, 99], [1, 1, 1])], vocab=64, shard_size=1)
    with pytest.raises(ConvertError, match=r"s00-000\.safetensors.*99"):
        convert(_cfg(store.root, 3), store)


def test_a_store_without_loss_tokens_is_an_error(tmp_path: Path) -> None:
    store = make_store(tmp_path / "run", [([1, 2], [0, 0])], shard_size=1)
    with pytest.raises(ConvertError, match="no loss-masked tokens"):
        convert(_cfg(store.root, 3), store)
