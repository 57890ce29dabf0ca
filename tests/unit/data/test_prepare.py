"""prepare: input formats, bad rows, ids and duplicates, sharding, skip-existing and rewrite."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from eagle3.config import PipelineConfig
from eagle3.data.prepare import PrepareError, prepare
from eagle3.progress import Progress
from eagle3.store.run_store import RunStore

ASSETS = Path(__file__).resolve().parents[2] / "assets"
BAD_ROWS = ASSETS / "prepare_bad_rows.jsonl"


def conversation(i: int) -> dict:
    return {
        "messages": [
            {"role": "user", "content": f"What is {i} plus {i}?"},
            {"role": "assistant", "content": f"{i} plus {i} is {2 * i}."},
        ]
    }


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def config(tmp_path: Path, dataset: Path, **data: object) -> PipelineConfig:
    return PipelineConfig.model_validate({"run_dir": str(tmp_path / "run"), "data": {"dataset": str(dataset), **data}})


def run(cfg: PipelineConfig, demo_model: Path):  # type: ignore[no-untyped-def]
    store = RunStore(cfg.run_dir)
    return store, prepare(cfg, store, demo_model)


def test_bad_rows_are_skipped_and_reported_with_file_row_and_reason(tmp_path: Path, demo_model: Path) -> None:
    data = tmp_path / "rows.jsonl"
    shutil.copy(BAD_ROWS, data)
    with open(data, "ab") as f:
        f.write(b'{"messages": [{"role": "user", "content": "caf\xe9"}]}\n')  # latin-1 byte: not UTF-8
    store, m = run(config(tmp_path, data, max_length=64), demo_model)
    reasons = {b.row: b.reason for b in m.bad_rows}
    assert all(b.file == str(data) for b in m.bad_rows)
    assert reasons[2].startswith("unknown schema")
    assert reasons[3] == "empty conversation"
    assert reasons[4] == "no assistant turn"
    assert reasons[5].startswith("empty content")
    assert reasons[6].startswith("content not a string")
    assert reasons[7].startswith("content not decodable")
    assert reasons[8].startswith("not valid JSON")
    assert reasons[9].startswith("too long")
    assert reasons[11].startswith("message 0 (a tool result): the chat template has no tool support")
    assert reasons[12].startswith("not decodable as UTF-8")
    assert sorted(reasons) == [2, 3, 4, 5, 6, 7, 8, 9, 11, 12]
    assert m.num_samples == 2 and m.duplicates == 1  # row 10 repeats row 0
    t = store.read_prepared_shard(0).to_pydict()
    assert t["source"] == [f"{data}:0", f"{data}:1"]
    assert json.loads(t["messages"][1])[1] == {"role": "assistant", "content": "Red is a primary colour."}


def test_fail_mode_raises_naming_file_row_reason_and_the_switch(tmp_path: Path, demo_model: Path) -> None:
    cfg = config(tmp_path, BAD_ROWS, on_bad_row="fail")
    with pytest.raises(PrepareError, match=r"prepare_bad_rows.jsonl: row 2: unknown schema.*data.on_bad_row=skip"):
        run(cfg, demo_model)


def test_ids_are_deterministic_and_duplicates_dropped(tmp_path: Path, demo_model: Path) -> None:
    rows = [conversation(1), conversation(2), conversation(1), conversation(3), conversation(2)]
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    store, m = run(config(tmp_path, data), demo_model)
    ids = store.read_prepared_shard(0).column("sample_id").to_pylist()
    assert m.num_samples == 3 and m.duplicates == 2 and len(set(ids)) == 3
    other = RunStore(tmp_path / "other")
    prepare(config(tmp_path, data).model_copy(update={"run_dir": str(other.root)}), other, demo_model)
    assert other.read_prepared_shard(0).column("sample_id").to_pylist() == ids


def test_shards_hold_shard_size_samples_in_input_order(tmp_path: Path, demo_model: Path) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", [conversation(i) for i in range(7)])
    seen: list[Progress] = []
    cfg = config(tmp_path, data, shard_size=3, max_samples=6)
    store = RunStore(cfg.run_dir)
    m = prepare(cfg, store, demo_model, report=seen.append)
    assert m.shards == [3, 3] and m.num_samples == 6
    sources = [s.source for i in range(2) for s in store.prepared_samples(i)]
    assert sources == [f"{data}:{i}" for i in range(6)]
    shard0 = store.read_prepared_shard(0).to_pydict()
    assert m.shard_tokens[0] == sum(shard0["num_tokens"]) == sum(len(x) for x in shard0["input_ids"])
    assert m.num_loss_tokens == sum(sum(s.loss_mask) for i in range(2) for s in store.prepared_samples(i))
    assert seen[-1].stage == "prepare" and seen[-1].done == 6


def test_rerun_skips_and_config_change_rewrites_and_drops_stale_shards(tmp_path: Path, demo_model: Path) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", [conversation(i) for i in range(5)])
    store, first = run(config(tmp_path, data, shard_size=2), demo_model)
    paths = sorted(store.prepared_dir.glob("*"))
    mtimes = [p.stat().st_mtime_ns for p in paths]
    again = prepare(config(tmp_path, data, shard_size=2), store, demo_model)
    assert again == first
    assert [p.stat().st_mtime_ns for p in paths] == mtimes
    changed = prepare(config(tmp_path, data, shard_size=4), store, demo_model)
    assert changed.shards == [4, 1] and changed.dataset_fingerprint != first.dataset_fingerprint
    shards = sorted(p.name for p in store.prepared_dir.glob("shard-*.arrow"))
    assert shards == ["shard-00000.arrow", "shard-00001.arrow"]
    store.prepared_shard_path(1).unlink()  # a deleted shard is rebuilt, not replayed
    assert prepare(config(tmp_path, data, shard_size=4), store, demo_model).shards == [4, 1]
    assert store.prepared_shard_path(1).is_file()


def test_parquet_and_save_to_disk_inputs_give_the_same_samples(tmp_path: Path, demo_model: Path) -> None:
    import datasets

    rows = [conversation(i) for i in range(3)]
    ds = datasets.Dataset.from_list(rows)
    ds.to_parquet(str(tmp_path / "d.parquet"))
    datasets.DatasetDict({"train": ds}).save_to_disk(str(tmp_path / "saved"))
    jsonl = write_jsonl(tmp_path / "d.jsonl", rows)
    ids = []
    for name, path in [("a", jsonl), ("b", tmp_path / "d.parquet"), ("c", tmp_path / "saved")]:
        cfg = config(tmp_path, path).model_copy(update={"run_dir": str(tmp_path / name)})
        store = RunStore(cfg.run_dir)
        assert prepare(cfg, store, demo_model).num_samples == 3
        ids.append(store.read_prepared_shard(0).column("sample_id").to_pylist())
    assert ids[0] == ids[1] == ids[2]
    with pytest.raises(PrepareError, match=r"no split 'test'.*\['train'\].*data.split"):
        run(config(tmp_path, tmp_path / "saved", split="test"), demo_model)


def test_unknown_dataset_path_names_the_path(tmp_path: Path, demo_model: Path) -> None:
    with pytest.raises(PrepareError, match=r"data.dataset: .*missing.jsonl does not exist"):
        run(config(tmp_path, tmp_path / "missing.jsonl"), demo_model)
    (tmp_path / "d.csv").write_text("a,b\n")
    with pytest.raises(PrepareError, match=r"unsupported type '.csv'"):
        run(config(tmp_path, tmp_path / "d.csv"), demo_model)


def test_demo_prompt_set_prepares_without_bad_rows(tmp_path: Path, demo_model: Path) -> None:
    demo = Path(__file__).resolve().parents[3] / "data" / "demo_prompts.jsonl"
    store, m = run(config(tmp_path, demo), demo_model)
    assert m.num_samples == 200 and m.bad_rows == [] and m.duplicates == 0
    messages = store.read_prepared_shard(0).column("messages").to_pylist()
    assert sum(1 for msgs in messages if len(json.loads(msgs)) == 4) == 20
    assert all(sum(s.loss_mask) > 0 for s in store.prepared_samples(0))
