"""grow x FP8 store x warm-start retraining x promotion on the demo model: a first draft is trained on an FP8 store
and promoted; the store grows (only the new shard is extracted, old files untouched), convert runs again, a new
training starts from the promoted draft (train.init: previous) on the grown FP8 store, and the better draft it
makes is promoted. Real training, export and offline evaluation; the library calls the tasks make."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3.config import PipelineConfig
from eagle3.convert.stage import convert
from eagle3.data.prepare import prepare
from eagle3.extract.engines.transformers_engine import TransformersEngine
from eagle3.release.export import export_draft
from eagle3.release.promote import current_link, pointed, promote
from eagle3.store.run_store import RunStore
from tests.integration.demo_facts import FACTS, TRAIN
from tests.integration.test_intake import extract_all, snapshot
from tests.integration.test_retrain import evaluation, train, trained_export
from tests.landing import drop

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]


def row(i: int) -> dict:
    return {"messages": [{"role": "user", "content": f"Tell me fact {i}."},
                         {"role": "assistant", "content": FACTS[i % len(FACTS)] + f" That is fact {i}."}]}  # fmt: skip


def test_a_warm_start_on_a_grown_fp8_store_trains_from_the_promoted_draft_and_is_promoted(
    tmp_path: Path, demo_model: Path
) -> None:
    traffic = tmp_path / "grow"
    traffic.mkdir()
    drop(traffic, "day1.jsonl", [row(i) for i in range(6)])
    cfg = PipelineConfig.model_validate({
        "run_dir": str(tmp_path / "run"), "model": str(demo_model), "stages": ["prepare", "extract"],
        "server": {"device": "cpu"}, "extract": {"store_dtype": "float8_e4m3"}, "train": TRAIN,
        "data": {"dataset": str(traffic), "max_length": 128, "shard_size": 6},
        "evaluate": {"dataset": str(traffic / "day1.jsonl"), "num_prompts": 3, "max_new_tokens": 8, "draft_steps": 2},
    })  # fmt: skip
    store = RunStore(cfg.run_dir)
    root = Path(cfg.run_dir)
    engine = TransformersEngine(demo_model, device="cpu", dtype="bfloat16", batch_tokens=512, store_dtype="float8_e4m3")
    prepare(cfg, store, demo_model)
    assert len(extract_all(cfg, store, demo_model, engine)) == 6
    convert(cfg, store, workers=1)
    first = trained_export(cfg, demo_model, "first", lr=1e-9, max_steps=2)  # a draft barely trained
    assert promote(root, first, evaluation(cfg, demo_model, "first")).promoted  # nothing to beat
    before = snapshot(store)

    drop(traffic, "day2.jsonl", [row(i) for i in range(6, 12)])
    assert prepare(cfg, store, demo_model).shards == [6, 6]
    assert sorted(extract_all(cfg, store, demo_model, engine)) == sorted(store.prepared_ids(1))  # once each
    assert {k: v for k, v in snapshot(store).items() if k in before} == before
    info = store.read_run_info()
    assert info is not None and info.store_dtype == "float8_e4m3" and [i.new_samples for i in info.intakes] == [6, 6]
    convert(cfg, store, workers=1)

    previous = pointed(current_link(root))
    assert previous == first.resolve()
    out = root / "trains" / "warm"
    with train(cfg, demo_model, out, init_from=previous, lr=3e-3, max_steps=40) as warm:
        assert warm.warm is not None  # started from the promoted draft's weights, on the grown FP8 store
        warm.run()
    dest = root / "draft" / "exports" / "warm"
    export_draft(out, root, demo_model, dest, speculative_tokens=cfg.evaluate.draft_steps)
    decision = promote(root, dest, evaluation(cfg, demo_model, "warm"))
    assert decision.promoted, decision.reason
    assert pointed(current_link(root)) == dest.resolve()
    assert json.loads((root / "draft" / "promotion.json").read_text())["promoted"] is True
