"""data.dataset as a file, a folder or a glob: the files it names, each with its fingerprint; an appended file
is taken in again, its known rows skipped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3.config import PipelineConfig
from eagle3.data.prepare import PrepareError, prepare
from eagle3.data.sources.common import SourceError, file_sha256
from eagle3.data.sources.local import list_source_files
from eagle3.store.run_store import RunStore


def rows(*ids: int) -> str:
    turns = [[{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}] for i in ids]
    return "".join(json.dumps({"messages": t}) + "\n" for t in turns)


def test_a_folder_lists_data_files_recursively_in_name_order_skipping_hidden_and_other_files(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "2.jsonl").write_text(rows(2))
    (tmp_path / "1.jsonl").write_text(rows(1))
    (tmp_path / ".3.jsonl.part").write_text(rows(3))  # still being written
    (tmp_path / "notes.txt").write_text("x")
    files = list_source_files(str(tmp_path))
    assert [f.name for f in files] == [str(tmp_path / "1.jsonl"), str(tmp_path / "b" / "2.jsonl")]
    assert files[0].sha256 == file_sha256(tmp_path / "1.jsonl") and files[0].size == len(rows(1))
    assert [f.name for f in list_source_files(str(tmp_path / "**" / "*.jsonl"))] == [f.name for f in files]
    assert list_source_files(str(tmp_path / "none-*.jsonl")) == []
    with pytest.raises(SourceError, match=r"missing does not exist"):
        list_source_files(str(tmp_path / "missing"))


def test_a_changed_file_is_read_again_and_only_its_new_rows_are_added(tmp_path: Path, demo_model: Path) -> None:
    data = tmp_path / "in"
    data.mkdir()
    (data / "a.jsonl").write_text(rows(0, 1))
    cfg = PipelineConfig.model_validate({"run_dir": str(tmp_path / "run"), "data": {"dataset": str(data / "*.jsonl")}})
    store = RunStore(cfg.run_dir)
    assert prepare(cfg, store, demo_model).num_samples == 2
    (data / "a.jsonl").write_text(rows(0, 1, 2))  # appended
    m = prepare(cfg, store, demo_model)
    assert m.shards == [2, 1] and m.intakes[-1].known_samples == 2 and m.intakes[-1].new_samples == 1
    assert [s.source for s in store.prepared_samples(1)] == [f"{data / 'a.jsonl'}:2"]
    assert m.files == {str(data / "a.jsonl"): file_sha256(data / "a.jsonl")}


def test_an_unsupported_file_names_the_path(tmp_path: Path, demo_model: Path) -> None:
    (tmp_path / "d.csv").write_text("a\n")
    data = {"dataset": str(tmp_path / "d.csv")}
    cfg = PipelineConfig.model_validate({"run_dir": str(tmp_path / "run"), "data": data})
    with pytest.raises(PrepareError, match=r"d.csv has unsupported type '.csv'"):
        prepare(cfg, RunStore(cfg.run_dir), demo_model)
