"""Datasets by name (eagle3/data/sources/hub.py): a dataset repository directory goes through the same
datasets.load_dataset call as a Hub id (offline here), lists of sources with a max_samples each, and an id that
cannot be reached is an error that names it and says how to pre-download it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3.config import DataSource, PipelineConfig
from eagle3.data.prepare import PrepareError, dataset_fingerprint, prepare
from eagle3.data.sources.hub import is_hub
from eagle3.store.run_store import RunStore


def chat(q: str, a: str) -> str:
    return json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}) + "\n"


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A dataset repository as the Hub stores one: data files named by split (here train and test)."""
    root = tmp_path / "my-org-chats"
    (root / "data").mkdir(parents=True)
    (root / "data" / "train.jsonl").write_text(
        chat("One?", "1.") + '{"text": "no messages"}\n' + chat("Two?", "2.") + chat("Three?", "3.")
    )
    (root / "data" / "test.jsonl").write_text(chat("Test?", "T."))
    return root


def test_names_are_read_as_hub_ids_and_paths_as_local_files(tmp_path: Path, repo: Path) -> None:
    assert is_hub(DataSource(dataset="HuggingFaceH4/ultrachat_200k"))  # type: ignore[call-arg]
    assert is_hub(DataSource(dataset=str(repo)))  # type: ignore[call-arg]
    assert not is_hub(DataSource(dataset="data/missing.jsonl"))  # type: ignore[call-arg]
    assert not is_hub(DataSource(dataset=str(tmp_path / "missing")))  # type: ignore[call-arg]


def test_a_dataset_repository_directory_is_prepared_through_load_dataset_by_split(
    tmp_path: Path, demo_model: Path, repo: Path, offline: None
) -> None:
    cfg = PipelineConfig.model_validate({"run_dir": str(tmp_path / "run"), "data": {"dataset": str(repo)}})
    m = prepare(cfg, RunStore(cfg.run_dir), demo_model)
    assert m.num_samples == 3
    assert [(b.file, b.row) for b in m.bad_rows] == [(f"{repo}:train", 1)]  # the source, split and row
    assert [s.source for s in RunStore(cfg.run_dir).prepared_samples(0)] == [f"{repo}:train:{i}" for i in (0, 2, 3)]
    cfg.data.split = "test"
    assert dataset_fingerprint(cfg.data) != m.dataset_fingerprint
    assert prepare(cfg, RunStore(cfg.run_dir), demo_model).num_samples == 1


def test_a_list_of_sources_is_read_in_order_with_a_max_samples_each(
    tmp_path: Path, demo_model: Path, repo: Path, offline: None
) -> None:
    local = tmp_path / "local.jsonl"
    local.write_text(chat("A?", "a.") + chat("B?", "b.") + chat("C?", "c."))
    cfg = PipelineConfig.model_validate(
        {
            "run_dir": str(tmp_path / "run"),
            "data": {
                "sources": [
                    {"dataset": str(local), "max_samples": 2},
                    {"dataset": str(repo), "split": "train", "max_samples": 3},
                ]
            },
        }
    )
    m = prepare(cfg, RunStore(cfg.run_dir), demo_model)
    sources = [s.source for s in RunStore(cfg.run_dir).prepared_samples(0)]
    assert sources == [f"{local}:0", f"{local}:1", f"{repo}:train:0", f"{repo}:train:2"]  # row 1 is bad
    assert m.num_samples == 4 and len(m.bad_rows) == 1


def test_an_unreachable_hub_id_names_it_and_how_to_pre_download_it(
    tmp_path: Path, demo_model: Path, offline: None
) -> None:
    cfg = PipelineConfig.model_validate(
        {"run_dir": str(tmp_path / "run"), "data": {"dataset": "no-such-org/eagle3-no-such-dataset", "subset": "x"}}
    )
    with pytest.raises(PrepareError, match=r"'no-such-org/eagle3-no-such-dataset'.*pre-download.*save_to_disk"):
        prepare(cfg, RunStore(cfg.run_dir), demo_model)
