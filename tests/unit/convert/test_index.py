"""Training index: one row per sample with its location and lengths, in store order."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from eagle3.config import PipelineConfig
from eagle3.convert import INDEX_SCHEMA, convert, read_index
from eagle3.store.sample_format import read_sample
from tests.unit.convert.convert_fixtures import make_store

SAMPLES = [([5, 6, 7], [0, 1, 1]), ([8] * 7, [1] * 7), ([1, 2], [0, 0]), ([3, 4, 5, 6], [0, 0, 1, 0]), ([9], [1])]


def test_index_lists_every_sample_with_its_path_and_lengths_in_store_order(tmp_path: Path) -> None:
    store = make_store(tmp_path / "run", SAMPLES, shard_size=2)
    res = convert(PipelineConfig.model_validate({"run_dir": str(store.root)}), store)
    table = read_index(Path(res.index_path))
    assert table.schema.remove_metadata() == INDEX_SCHEMA
    rows = table.to_pylist()
    assert [(r["shard"], r["sample_id"]) for r in rows] == [
        (0, "s00-000"), (0, "s00-001"), (1, "s01-000"), (1, "s01-001"), (2, "s02-000"),
    ]  # fmt: skip
    assert [r["num_tokens"] for r in rows] == [len(i) for i, _ in SAMPLES]
    assert [r["num_loss_tokens"] for r in rows] == [sum(m) for _, m in SAMPLES]
    for r, (ids, _) in zip(rows, SAMPLES, strict=True):
        assert not Path(r["path"]).is_absolute()
        assert read_sample(store.root / r["path"]).input_ids.tolist() == ids
    assert table.schema.metadata[b"fingerprint"].decode() == res.fingerprint
    assert res.num_samples == 5 and res.num_tokens == 17 and res.num_shards == 3


def test_reading_a_file_that_is_not_an_index_fails(tmp_path: Path) -> None:
    path = tmp_path / "other.arrow"
    table = pa.table({"x": [1, 2]})
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    with pytest.raises(ValueError, match="not an eagle3-index/1 file"):
        read_index(path)
