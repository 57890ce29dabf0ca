"""Growing an FP8 store on the demo model (transformers engine), then the store's repairs on the grown store:
the intake extracts exactly the new samples in FP8, the grown store is the store one run over all the data makes
(parity), verify after the intake finds every file sound and rewrites nothing, and a retry after a sample file
was deleted redoes exactly that sample (the retry-failed flow's plan and shard task, called as the flow calls
them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from eagle3.config import PipelineConfig
from eagle3.data.prepare import prepare
from eagle3.extract.engines.transformers_engine import TransformersEngine
from eagle3.extract.shard import extract_shard, open_run
from eagle3.store.failed_shards import plan_retry_samples
from eagle3.store.run_store import RunStore
from eagle3.store.sample_format import FP8, read_sample
from eagle3.store.verify import verify_run
from tests.integration.test_extract import CountingEngine
from tests.integration.test_intake import conversation, extract_all, snapshot
from tests.landing import drop
from tests.store_compare import store_contents

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]


def fp8_config(run_dir: Path, dataset: Path, model: Path) -> PipelineConfig:
    return PipelineConfig.model_validate(
        {
            "run_dir": str(run_dir),
            "model": str(model),
            "stages": ["prepare", "extract"],
            "data": {"dataset": str(dataset), "shard_size": 2, "max_length": 128},
            "server": {"device": "cpu", "dtype": "bfloat16"},
            "extract": {"store_dtype": "float8_e4m3"},
        }
    )


def test_a_grown_fp8_store_extracts_the_new_samples_once_verifies_and_retries_a_deleted_file(
    tmp_path: Path, demo_model: Path
) -> None:
    traffic = tmp_path / "grow"
    traffic.mkdir()
    drop(traffic, "day1.jsonl", [conversation(i) for i in range(4)])
    cfg = fp8_config(tmp_path / "run", traffic, demo_model)
    store = RunStore(cfg.run_dir)
    engine = TransformersEngine(demo_model, device="cpu", dtype="bfloat16", batch_tokens=256, store_dtype="float8_e4m3")
    prepare(cfg, store, demo_model)
    assert len(extract_all(cfg, store, demo_model, engine)) == 4
    before = snapshot(store)

    drop(traffic, "day2.jsonl", [conversation(i) for i in range(4, 6)])
    grown = prepare(cfg, store, demo_model)
    assert grown.shards == [2, 2, 2] and grown.intakes[-1].shards == [2]
    new_ids = store.prepared_ids(2)
    assert sorted(extract_all(cfg, store, demo_model, engine)) == sorted(new_ids)  # once each
    assert {k: v for k, v in snapshot(store).items() if k in before} == before  # same bytes, same mtimes
    info = store.read_run_info()
    assert info is not None and info.store_dtype == "float8_e4m3" and [i.new_samples for i in info.intakes] == [4, 2]
    assert all(read_sample(store.sample_path(2, sid)).aux_hidden_states.dtype == FP8 for sid in new_ids)

    # parity: one run over both days makes the same store, file for file
    fresh_cfg = fp8_config(tmp_path / "fresh", traffic, demo_model)
    fresh = RunStore(fresh_cfg.run_dir)
    prepare(fresh_cfg, fresh, demo_model)
    extract_all(fresh_cfg, fresh, demo_model, engine)
    assert store_contents(store) == store_contents(fresh)

    # verify after the intake: every file sound, nothing rewritten
    after_extract = snapshot(store)
    report = verify_run(store, full=True)
    assert report.clean and report.ok_count == 6 and report.missing_count == 0
    assert snapshot(store) == after_extract

    # retry-failed on the grown store: a deleted sample file of an old shard is redone, and only it
    lost = store.prepared_ids(0)[1]
    store.sample_path(0, lost).unlink()
    plan = plan_retry_samples(store)
    assert plan == {0: [lost]}
    counting = CountingEngine(engine)
    info = open_run(cfg, store, demo_model, engine.info)
    assert extract_shard(store, 0, counting, info).status == "complete"
    assert counting.calls == [[lost]]
    kept = {k: v for k, v in after_extract.items() if lost not in k and not k.endswith("manifest.json")}
    assert {k: v for k, v in snapshot(store).items() if k in kept} == kept
    assert store_contents(store) == store_contents(fresh)
