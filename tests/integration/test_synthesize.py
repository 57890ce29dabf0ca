"""synthesize with the demo model: greedy regeneration, turn by turn, skipped on re-run."""

from __future__ import annotations

import itertools
import json
import shutil
import time
from pathlib import Path

import pytest

import eagle3.data.synthesize as synth
from eagle3.config import PipelineConfig
from eagle3.data.prepare import prepare
from eagle3.progress import Progress
from eagle3.store.run_store import RunStore

PROMPTS = Path(__file__).resolve().parents[1] / "assets" / "synth_prompts.jsonl"

pytestmark = pytest.mark.slow


def test_synthesize_regenerates_turns_and_rerun_does_no_generation(
    tmp_path: Path, demo_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "prompts.jsonl"
    shutil.copy(PROMPTS, data)
    cfg = PipelineConfig.model_validate(
        {
            "run_dir": str(tmp_path / "run"),
            "data": {"dataset": str(data), "shard_size": 2},
            "synthesize": {"max_new_tokens": 16, "temperature": 0.0, "batch_size": 4},
            "server": {"device": "cpu", "dtype": "bfloat16"},
        }
    )
    store = RunStore(cfg.run_dir)
    source = prepare(cfg, store, demo_model)
    source_ids = [s.sample_id for i in range(len(source.shards)) for s in store.prepared_samples(i)]

    reports: list[tuple[float, Progress]] = []
    t0 = time.monotonic()
    m = synth.synthesize(cfg, store, demo_model, lambda p: reports.append((time.monotonic(), p))).manifest
    # progress: a first report before the model loads, then at least every 30 s (every decode step may report),
    # and the last figure is the generation's own, not the tokenize step's
    times = [t0] + [t for t, _ in reports]
    assert reports[0][1].stage == "synthesize" and reports[0][0] - t0 < 60
    assert max(b - a for a, b in itertools.pairwise(times)) < 30
    assert reports[-1][1].stage == "synthesize" and reports[-1][1].done == 3 and reports[-1][1].tokens > 0
    assert m.dataset == f"synthesized:{data}" and m.dataset_fingerprint != source.dataset_fingerprint
    assert m.num_samples == 3 and m.shards == [2, 1]

    records = [json.loads(line) for i in range(2) for line in synth.synthesized_shard_path(store, i).open()]
    assert [r["source"] for r in records] == [f"{data}:{i}" for i in range(3)]
    assert [r["source_sample_id"] for r in records] == source_ids
    france = records[0]["messages"]
    assert france[0]["content"] == "What is the capital of France?"
    assert "Paris" in france[1]["content"]
    sky = records[1]["messages"]  # two assistant turns, both regenerated, user turns kept
    assert [x["content"] for x in sky if x["role"] == "user"] == ["Name a colour of the sky.", "And at sunset?"]
    assert "Blue." not in [x["content"] for x in sky] and "Orange." not in [x["content"] for x in sky]

    # prepared/ now holds the target's own answers, under the loss mask
    first = store.prepared_samples(0)[0]
    tok = synth.ChatTokenizer.from_model_dir(demo_model).tokenizer
    masked = tok.decode([t for t, k in zip(first.input_ids, first.loss_mask, strict=True) if k])
    assert masked == france[1]["content"] + "<|im_end|>"
    assert first.sample_id not in source_ids and first.source == f"{data}:0"
    synth_ids = [s.sample_id for i in range(2) for s in store.prepared_samples(i)]

    # a finished synthesize (even after prepare rewrote prepared/) loads no model and generates nothing
    def no_model(*_: object) -> None:
        raise AssertionError("synthesize loaded the model on a re-run")

    monkeypatch.setattr(synth, "load_model", no_model)
    mtimes = [synth.synthesized_shard_path(store, i).stat().st_mtime_ns for i in range(2)]
    assert synth.synthesize(cfg, store, demo_model).manifest == m
    # the prepare stage of a re-run keeps the synthesis of these inputs (no tokenizing, prepared/ never goes back to
    # the source), and synthesize's summary of the generation stays
    summary = synth.summary_path(store).read_bytes()
    prepared = [store.prepared_shard_path(i).stat().st_mtime_ns for i in range(2)]
    assert prepare(cfg, store, demo_model) == m
    assert [store.prepared_shard_path(i).stat().st_mtime_ns for i in range(2)] == prepared
    assert synth.synthesize(cfg, store, demo_model).manifest == m and synth.summary_path(store).read_bytes() == summary
    # without synthesize in the run's stages, or asked for the source (raw), prepare prepares the source again;
    # synthesize then assembles its answers again from the checkpoints, still without a model
    no_synth = cfg.model_copy(update={"stages": ["prepare", "extract"]})
    assert prepare(no_synth, store, demo_model).dataset_fingerprint == source.dataset_fingerprint
    again = synth.synthesize(cfg, store, demo_model).manifest
    assert again.dataset_fingerprint == m.dataset_fingerprint and again.num_samples == 3
    assert prepare(cfg, store, demo_model, raw=True).dataset_fingerprint == source.dataset_fingerprint
    again = synth.synthesize(cfg, store, demo_model).manifest
    assert again.dataset_fingerprint == m.dataset_fingerprint and again.num_samples == 3
    assert [s.sample_id for i in range(2) for s in store.prepared_samples(i)] == synth_ids
    assert [synth.synthesized_shard_path(store, i).stat().st_mtime_ns for i in range(2)] == mtimes
