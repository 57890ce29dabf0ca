"""The prompts stage in a growing run (docs/operations.md, the matrix): more requests asked of the target
(`prompts.self_instruct` raised) writes only the new requests, prepare takes in only the new rows of the rewritten
prompts.jsonl, synthesize answers only them and extraction adds exactly their samples; no file already in the store
or among the written requests changes (bytes and mtimes). Demo model, transformers engine, CPU."""

from __future__ import annotations

from pathlib import Path

import pytest

import eagle3.data.prompts as pg
import eagle3.data.synthesize as synth
from eagle3.config import PipelineConfig
from eagle3.data.prepare import prepare
from eagle3.extract.engines.transformers_engine import TransformersEngine
from eagle3.store.run_store import RunStore
from tests.integration.test_grow_synthesize import store_files
from tests.integration.test_intake import extract_all

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def config(tmp_path: Path, requests: int) -> PipelineConfig:
    run = tmp_path / "run"
    return PipelineConfig.model_validate(
        {
            "run_dir": str(run),
            "stages": ["prompts", "prepare", "synthesize", "extract"],
            # min_words 1 and exact-duplicate removal only: every request of the random-ish demo model is kept,
            # so the counts below are the requests written
            "prompts": {
                "self_instruct": requests,
                "max_new_tokens": 16,
                "min_words": 1,
                "dedup_threshold": 1.0,
                "exclude_eval": False,
                "grid": str(ROOT / "data" / "prompt_grid.yaml"),
            },
            "data": {"dataset": str(run / "prompts" / "prompts.jsonl"), "shard_size": 2, "max_length": 128},
            "synthesize": {"max_new_tokens": 8, "batch_size": 4},
            "server": {"device": "cpu", "dtype": "bfloat16"},
        }
    )


def request_files(cfg: PipelineConfig) -> dict[str, tuple[bytes, int]]:
    return {str(p): (p.read_bytes(), p.stat().st_mtime_ns) for p in (pg.out_dir(cfg) / "samples").glob("*.json")}


def test_more_requests_on_a_grown_run_are_written_answered_and_extracted_once_each(
    tmp_path: Path, demo_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = config(tmp_path, 2)
    store = RunStore(first.run_dir)
    engine = TransformersEngine(demo_model, device="cpu", dtype="bfloat16", batch_tokens=256)
    assert pg.build_prompts(first, demo_model).generated == 2
    prepare(first, store, demo_model)
    assert synth.synthesize(first, store, demo_model).summary.generated == 2
    assert len(extract_all(first, store, demo_model, engine)) == 2
    before, requests_before = store_files(store), request_files(first)

    grown = config(tmp_path, 4)  # the same run, two more requests asked of the target
    summary = pg.build_prompts(grown, demo_model)
    assert summary.generated == 2 and summary.prompts == 4  # only the two new cells were written
    assert {k: v for k, v in request_files(grown).items() if k in requests_before} == requests_before
    source = prepare(grown, store, demo_model)
    assert source.num_samples == 4 and [i.new_samples for i in source.intakes] == [2, 2]
    answered = synth.synthesize(grown, store, demo_model)
    assert answered.summary.generated == 2 and answered.manifest.num_samples == 4
    new_ids = {s.sample_id for i in answered.manifest.intakes[-1].shards for s in store.prepared_samples(i)}
    assert sorted(extract_all(grown, store, demo_model, engine)) == sorted(new_ids) and len(new_ids) == 2
    assert {k: v for k, v in store_files(store).items() if k in before} == before  # same bytes, same mtimes
    info = store.read_run_info()
    assert info is not None and [i.new_samples for i in info.intakes] == [2, 2]

    # nothing new: no model is loaded, no request, answer or sample is made again
    def no_model(*_: object) -> None:
        raise AssertionError("a stage loaded the model with nothing to generate")

    monkeypatch.setattr(pg, "load_model", no_model)
    monkeypatch.setattr(synth, "load_model", no_model)
    assert pg.build_prompts(grown, demo_model).generated == 0
    again = synth.synthesize(grown, store, demo_model)
    assert again.manifest == answered.manifest and again.summary.generated == again.summary.tokens == 0
    assert extract_all(grown, store, demo_model, engine) == []
    assert {k: v for k, v in store_files(store).items() if k in before} == before
