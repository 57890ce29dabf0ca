"""A growing dataset through synthesize on the demo model (transformers engine): the second intake answers only its
new prompts, appends them to prepared/ as new shards with an intake record, extraction adds exactly them, and no
file already in the store changes (bytes and mtimes); a changed synthesize setting is refused naming the key,
before anything is written."""

from __future__ import annotations

from pathlib import Path

import pytest

import eagle3.data.synthesize as synth
from eagle3.config import PipelineConfig
from eagle3.data.prepare import prepare
from eagle3.data.synthesis_key import SynthesisMixError
from eagle3.extract.engines.transformers_engine import TransformersEngine
from eagle3.store.run_store import RunStore
from tests.integration.test_intake import conversation, extract_all
from tests.landing import drop

pytestmark = pytest.mark.slow


def store_files(store: RunStore) -> dict[str, tuple[bytes, int]]:
    """Every data file of the store: prepared shards, sample files and shard manifests, synthesized shards, the
    source's prepared shards."""
    files = [
        *store.prepared_dir.glob("shard-*.arrow"),
        *(store.root / "shards").rglob("*"),
        *store.synthesized_shard_paths(),
        *store.synthesis_source().prepared_dir.glob("shard-*.arrow"),
    ]
    return {str(p): (p.read_bytes(), p.stat().st_mtime_ns) for p in files if p.is_file()}


def test_a_grown_dataset_synthesizes_and_extracts_only_the_new_prompts(tmp_path: Path, demo_model: Path) -> None:
    traffic = tmp_path / "grow"
    traffic.mkdir()
    drop(traffic, "day1.jsonl", [conversation(i) for i in range(4)])
    cfg = PipelineConfig.model_validate(
        {
            "run_dir": str(tmp_path / "run"),
            "model": str(demo_model),
            "stages": ["prepare", "synthesize", "extract"],
            "data": {"dataset": str(traffic), "shard_size": 2, "max_length": 128},
            "synthesize": {"max_new_tokens": 8, "batch_size": 4},
            "server": {"device": "cpu", "dtype": "bfloat16"},
        }
    )
    store = RunStore(cfg.run_dir)
    engine = TransformersEngine(demo_model, device="cpu", dtype="bfloat16", batch_tokens=256)
    prepare(cfg, store, demo_model)
    first = synth.synthesize(cfg, store, demo_model)
    assert first.summary.generated == 4 and first.manifest.shards == [2, 2]
    assert first.manifest.synthesis is not None and [i.new_samples for i in first.manifest.intakes] == [4]
    assert len(extract_all(cfg, store, demo_model, engine)) == 4
    before = store_files(store)

    drop(traffic, "day2.jsonl", [conversation(i) for i in range(4, 7)] + [conversation(0)])  # one repeat of day 1
    source = prepare(cfg, store, demo_model)  # the prepare stage: the source grows, prepared/ stays synthesize's
    assert source.num_samples == 7 and [i.new_samples for i in source.intakes] == [4, 3]
    assert {k: v for k, v in store_files(store).items() if k in before} == before
    grown = synth.synthesize(cfg, store, demo_model)
    assert grown.summary.generated == 3  # only the new prompts, each once
    m = grown.manifest
    assert m.num_samples == 7 and m.shards == [2, 2, 2, 1]
    assert list(m.intakes[-1].files) == [str(traffic / "day2.jsonl")] and m.intakes[-1].shards == [2, 3]
    assert (m.intakes[-1].new_samples, m.intakes[-1].known_samples) == (3, 1)  # as the source's intake says
    assert m.intakes[-1].dataset_fingerprint == m.dataset_fingerprint
    new_ids = [s.sample_id for i in (2, 3) for s in store.prepared_samples(i)]
    assert sorted(s.source for i in (2, 3) for s in store.prepared_samples(i)) == [
        f"{traffic / 'day2.jsonl'}:{r}" for r in range(3)
    ]

    extracted = extract_all(cfg, store, demo_model, engine)
    assert sorted(extracted) == sorted(new_ids)  # exactly the new samples, once each
    assert {k: v for k, v in store_files(store).items() if k in before} == before  # same bytes, same mtimes
    info = store.read_run_info()
    assert info is not None and [i.new_samples for i in info.intakes] == [4, 3]
    assert info.dataset_fingerprint == m.dataset_fingerprint
    assert sum(len(x.samples) for x in store.manifests()) == 7

    # a re-run generates, prepares and extracts nothing
    assert synth.synthesize(cfg, store, demo_model).manifest == m and prepare(cfg, store, demo_model) == m
    assert extract_all(cfg, store, demo_model, engine) == []

    # a changed generation setting is refused at the prepare stage (the first), naming the key, writing nothing
    manifest = store.prepared_manifest_path.read_bytes()
    longer = cfg.model_copy(update={"synthesize": cfg.synthesize.model_copy(update={"max_new_tokens": 16})})
    with pytest.raises(SynthesisMixError, match=r"synthesize.max_new_tokens: store has 8, now 16.*\n.*new run_dir"):
        prepare(longer, store, demo_model)
    with pytest.raises(SynthesisMixError, match=r"synthesize.max_new_tokens"):
        synth.synthesize(longer, store, demo_model)
    assert store.prepared_manifest_path.read_bytes() == manifest
    assert {k: v for k, v in store_files(store).items() if k in before} == before
