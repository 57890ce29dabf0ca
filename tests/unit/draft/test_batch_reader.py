"""The trainer's row reader (eagle3/draft/data.py read_row): bytes straight from sample files into one packed
row, equal to what the store's own reader gives, and a clear error naming the file for a damaged sample."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from eagle3.draft.data import DataError, plan_epoch, read_row, row_tokens
from eagle3.store.sample_format import encode_sample, read_sample, write_sample


def sample(path: Path, t: int, seed: int, k: int = 3, h: int = 8, dtype: torch.dtype = torch.bfloat16) -> Path:
    g = torch.Generator().manual_seed(seed)
    write_sample(
        path,
        encode_sample(
            path.stem,
            [1, 2, 3][:k],
            torch.randint(0, 1000, (t,), generator=g),
            (torch.rand(t, generator=g) > 0.3).to(torch.uint8),
            torch.randn(t, k, h, generator=g).to(dtype),
            torch.randn(t, h, generator=g).to(dtype),
        ),
    )
    return path


def test_a_row_holds_each_sample_byte_for_byte_then_zero_padding(tmp_path: Path) -> None:
    paths = [sample(tmp_path / f"s{i}.safetensors", t, i) for i, t in enumerate((5, 11, 3))]
    row = read_row(paths, batch_tokens=24)
    assert row.num_tokens == 19 and row.aux_hidden.shape == (24, 3, 8) and row.aux_hidden.dtype == torch.bfloat16
    a = 0
    for d, p in enumerate(paths):
        s = read_sample(p)
        t = len(s.input_ids)
        assert torch.equal(row.input_ids[a : a + t], s.input_ids)
        assert torch.equal(row.loss_mask[a : a + t], s.loss_mask)
        assert torch.equal(row.aux_hidden[a : a + t], s.aux_hidden_states)
        assert torch.equal(row.last_hidden[a : a + t], s.last_hidden_state)
        assert row.positions[a : a + t].tolist() == list(range(t))
        assert row.remaining[a : a + t].tolist() == list(range(t - 1, -1, -1))
        assert set(row.doc[a : a + t].tolist()) == {d}
        a += t
    assert not row.aux_hidden[a:].any() and not row.last_hidden[a:].any() and not row.loss_mask[a:].any()
    assert set(row.doc[a:].tolist()) == {len(paths)}


def test_a_sample_longer_than_the_row_is_a_longer_row_of_its_own_whole(tmp_path: Path) -> None:
    """Not cut, not split: its row is the next multiple of batch_tokens (a longer step), the sample whole."""
    p = sample(tmp_path / "long.safetensors", 40, 7, dtype=torch.float32)
    row = read_row([p], batch_tokens=16)
    s = read_sample(p)
    assert row.num_tokens == 40 and row.input_ids.shape == (48,) and row.aux_hidden.shape == (48, 3, 8)
    assert torch.equal(row.aux_hidden[:40], s.aux_hidden_states) and torch.equal(row.input_ids[:40], s.input_ids)
    assert row.positions[:40].tolist() == list(range(40)) and row.remaining[39] == 0
    assert set(row.doc[40:].tolist()) == {1} and not row.loss_mask[40:].any()
    with pytest.raises(DataError, match=r"45 tokens of 2 samples do not fit in train.batch_tokens=16"):
        read_row([p, sample(tmp_path / "b.safetensors", 5, 1, dtype=torch.float32)], batch_tokens=16)


def test_the_plan_gives_a_long_sample_a_row_of_its_own_and_every_sample_a_row() -> None:
    lengths = [40, 5, 11, 3, 100, 7]
    rows = plan_epoch(lengths, batch_tokens=16, seed=0, epoch=0)
    assert sorted(i for r in rows for i in r) == list(range(len(lengths)))
    assert [0] in rows and [4] in rows and all(sum(lengths[i] for i in r) <= 16 for r in rows if r not in ([0], [4]))
    assert [row_tokens(n, 16) for n in (1, 16, 17, 40, 100)] == [16, 16, 32, 48, 112]


def test_a_truncated_sample_is_refused_naming_the_file(tmp_path: Path) -> None:
    p = sample(tmp_path / "cut.safetensors", 9, 1)
    p.write_bytes(p.read_bytes()[:-10])
    with pytest.raises(DataError, match=r"cut\.safetensors: not a complete sample file .*re-run extract"):
        read_row([p], batch_tokens=16)


def test_samples_of_different_hidden_sizes_are_refused_naming_both_files(tmp_path: Path) -> None:
    a, b = sample(tmp_path / "a.safetensors", 4, 1, h=8), sample(tmp_path / "b.safetensors", 4, 2, h=16)
    with pytest.raises(DataError, match=r"b\.safetensors: .*a\.safetensors has"):
        read_row([a, b], batch_tokens=16)
