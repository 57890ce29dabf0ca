"""A growing dataset on the demo model: an intake prepares and extracts only the new samples, leaves every file
already in the store as it was (bytes and mtimes), lists itself in run.json, and refuses what must not mix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from eagle3.config import PipelineConfig
from eagle3.data.prepare import PrepareError, prepare
from eagle3.extract.engines.transformers_engine import TransformersEngine
from eagle3.extract.shard import extract_shard, open_run, shard_is_complete
from eagle3.store.run_store import RunStore
from tests.integration.test_extract import CountingEngine
from tests.landing import drop

pytestmark = pytest.mark.slow


def conversation(i: int) -> dict:
    return {"messages": [{"role": "user", "content": f"Name a colour, number {i}."},
                         {"role": "assistant", "content": f"Colour {i}: blue."}]}  # fmt: skip


def snapshot(store: RunStore) -> dict[str, tuple[bytes, int]]:
    files = [*store.prepared_dir.glob("shard-*.arrow"), *(store.root / "shards").rglob("*")]
    return {str(p): (p.read_bytes(), p.stat().st_mtime_ns) for p in files if p.is_file()}


def extract_all(cfg: PipelineConfig, store: RunStore, model: Path, engine: Any) -> list[str]:
    """What the extract flow does per shard (skip complete shards, extract the rest); returns the ids extracted."""
    info = open_run(cfg, store, model, engine.info)
    counting = CountingEngine(engine)
    for shard in range(store.num_shards()):
        if not shard_is_complete(store, shard, info):
            assert extract_shard(store, shard, counting, info).status == "complete"
    return [sid for call in counting.calls for sid in call]


@pytest.fixture(scope="module")
def engine(demo_model: Path) -> TransformersEngine:
    return TransformersEngine(demo_model, device="cpu", dtype="bfloat16", batch_tokens=256)


def test_an_intake_prepares_and_extracts_only_the_new_samples_and_leaves_old_files_untouched(
    tmp_path: Path, demo_model: Path, engine: TransformersEngine
) -> None:
    traffic = tmp_path / "traffic"
    traffic.mkdir()
    drop(traffic, "day1.jsonl", [conversation(i) for i in range(6)])
    data = {"dataset": str(traffic), "shard_size": 4, "max_length": 128}
    cfg = PipelineConfig.model_validate({"run_dir": str(tmp_path / "run"), "model": str(demo_model), "data": data})
    store = RunStore(cfg.run_dir)
    first = prepare(cfg, store, demo_model)
    assert first.shards == [4, 2] and [list(i.files) for i in first.intakes] == [[str(traffic / "day1.jsonl")]]
    assert len(extract_all(cfg, store, demo_model, engine)) == 6
    before = snapshot(store)

    assert prepare(cfg, store, demo_model) == first  # nothing new landed: no intake
    drop(traffic, "day2.jsonl", [conversation(i) for i in range(6, 9)] + [conversation(0)])  # one repeat of day 1
    grown = prepare(cfg, store, demo_model)
    assert grown.shards == [4, 2, 3] and grown.num_samples == 9
    intake = grown.intakes[-1]
    assert list(intake.files) == [str(traffic / "day2.jsonl")] and intake.shards == [2]
    assert (intake.new_samples, intake.known_samples, intake.vanished_samples) == (3, 1, 0)
    assert intake.new_tokens == grown.shard_tokens[2]
    new_ids = [s.sample_id for s in store.prepared_samples(2)]

    extracted = extract_all(cfg, store, demo_model, engine)
    assert sorted(extracted) == sorted(new_ids)  # exactly the new samples, each once
    assert {k: v for k, v in snapshot(store).items() if k in before} == before  # same bytes, same mtimes
    info = store.read_run_info()
    assert info is not None and [i.new_samples for i in info.intakes] == [6, 3]
    assert info.dataset_fingerprint == grown.dataset_fingerprint
    assert sum(len(m.samples) for m in store.manifests()) == 9

    (traffic / "day1.jsonl").unlink()  # a source that disappeared is reported, its samples kept
    after = prepare(cfg, store, demo_model)
    assert after.intakes[-1].missing_files == [str(traffic / "day1.jsonl")]
    assert after.intakes[-1].vanished_samples == 6 and after.intakes[-1].new_samples == 0  # by recorded source row
    assert after.shards == grown.shards and extract_all(cfg, store, demo_model, engine) == []


def test_a_changed_tokenizer_or_max_length_is_refused_naming_the_key(tmp_path: Path, demo_model: Path,
                                                                      engine: TransformersEngine) -> None:  # fmt: skip
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(conversation(i)) + "\n" for i in range(3)))
    cfg = PipelineConfig.model_validate(
        {"run_dir": str(tmp_path / "run"), "model": str(demo_model), "data": {"dataset": str(data), "max_length": 128}}
    )
    store = RunStore(cfg.run_dir)
    prepare(cfg, store, demo_model)
    extract_all(cfg, store, demo_model, engine)
    other = tmp_path / "other-model"  # the same weights, another chat template
    other.mkdir()
    for f in demo_model.iterdir():
        if f.name != "tokenizer_config.json":
            (other / f.name).symlink_to(f)
    tok_cfg = json.loads((demo_model / "tokenizer_config.json").read_text())
    tok_cfg["chat_template"] = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    (other / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    manifest = (store.prepared_dir / "manifest.json").read_bytes()
    with pytest.raises(PrepareError, match=r"tokenizer_sha256 \(tokenizer or chat template\).*\n.*new run_dir"):
        prepare(cfg, store, other)
    longer = cfg.model_copy(update={"data": cfg.data.model_copy(update={"max_length": 256})})
    with pytest.raises(PrepareError, match=r"data.max_length: store has 128, now 256.*\n.*new run_dir"):
        prepare(longer, store, demo_model)
    assert (store.prepared_dir / "manifest.json").read_bytes() == manifest  # refused before writing anything
