"""The trainer's row reader (eagle3/draft/data.py read_row): bytes straight from sample files into one packed
row, equal to what the store's own reader gives, and a clear error naming the file for a damaged sample."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from eagle3.draft.data import DataError, read_row
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


def test_a_sample_longer_than_the_row_is_cut_to_its_first_tokens(tmp_path: Path) -> None:
    p = sample(tmp_path / "long.safetensors", 40, 7, dtype=torch.float32)
    row = read_row([p], batch_tokens=16)
    s = read_sample(p)
    assert row.num_tokens == 16
    assert torch.equal(row.aux_hidden, s.aux_hidden_states[:16]) and torch.equal(row.input_ids, s.input_ids[:16])


def test_a_truncated_sample_is_refused_naming_the_file(tmp_path: Path) -> None:
    p = sample(tmp_path / "cut.safetensors", 9, 1)
    p.write_bytes(p.read_bytes()[:-10])
    with pytest.raises(DataError, match=r"cut\.safetensors: not a complete sample file .*re-run extract"):
        read_row([p], batch_tokens=16)


def test_samples_of_different_hidden_sizes_are_refused_naming_both_files(tmp_path: Path) -> None:
    a, b = sample(tmp_path / "a.safetensors", 4, 1, h=8), sample(tmp_path / "b.safetensors", 4, 2, h=16)
    with pytest.raises(DataError, match=r"b\.safetensors: .*a\.safetensors has"):
        read_row([a, b], batch_tokens=16)
