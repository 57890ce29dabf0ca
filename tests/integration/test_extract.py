"""extract_shard end to end on the demo model and a tiny hand-made prepared shard."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import torch

from eagle3.config import PipelineConfig
from eagle3.extract.engines.base import Captured, Dumped, EngineInfo, Failed, Outcome
from eagle3.extract.engines.transformers_engine import TransformersEngine
from eagle3.extract.shard import RunMismatchError, extract_shard, open_run, shard_is_complete
from eagle3.progress import Progress
from eagle3.store.run_store import PREPARED_SCHEMA, PreparedManifest, PreparedSample, RunInfo, RunStore
from eagle3.store.sample_format import encode_sample
from eagle3.target.files import tokenizer_fingerprint

pytestmark = pytest.mark.slow

TEXTS = [
    "The capital of France is Paris.",
    "Draft models guess; the target model checks every guess in one pass.",
    "1 2 3 4 5 6 7 8 9 10",
    "A short one.",
    "Prefect runs each shard as a task with its own retries, so a crash costs one shard at most.",
]


class CountingEngine:
    """Wraps a real engine: records which samples each call asked for, and can fail chosen ones."""

    def __init__(self, inner: Any, fail: Sequence[str] = ()):
        self.inner, self.info = inner, inner.info
        self.fail = set(fail)
        self.calls: list[list[str]] = []

    def extract(self, samples: Sequence[PreparedSample]) -> Iterator[Outcome]:
        self.calls.append([s.sample_id for s in samples])
        for s in samples:
            if s.sample_id in self.fail:
                yield Failed(s, "injected failure for the test")
        yield from self.inner.extract([s for s in samples if s.sample_id not in self.fail])

    def close(self) -> None:
        pass


class ScriptedEngine:
    """No model: yields the outcomes a test scripts for each sample."""

    def __init__(self, info: EngineInfo, make: Any):
        self.info, self.make = info, make

    def extract(self, samples: Sequence[PreparedSample]) -> Iterator[Outcome]:
        for s in samples:
            yield self.make(s)

    def close(self) -> None:
        pass


def write_prepared(store: RunStore, tokenizer: Any, model_dir: Path, texts: list[str]) -> list[PreparedSample]:
    rows = []
    for i, text in enumerate(texts):
        ids = tokenizer(text).input_ids
        mask = [0] * (len(ids) // 2) + [1] * (len(ids) - len(ids) // 2)
        rows.append({"sample_id": f"t{i:03d}", "input_ids": ids, "loss_mask": mask, "num_tokens": len(ids),
                     "source": f"test:{i}", "messages": "[]"})  # fmt: skip
    store.write_prepared_shard(0, pa.Table.from_pylist(rows, schema=PREPARED_SCHEMA))
    tokens = sum(r["num_tokens"] for r in rows)
    store.write_prepared_manifest(
        PreparedManifest(
            dataset="test",
            dataset_fingerprint="fp-test",
            tokenizer_sha256=tokenizer_fingerprint(model_dir),
            num_samples=len(rows),
            num_tokens=tokens,
            num_loss_tokens=tokens // 2,
            shards=[len(rows)],
            shard_tokens=[tokens],
            config={},
        )
    )
    return store.prepared_samples(0)


@pytest.fixture(scope="module")
def engine(demo_model: Path) -> TransformersEngine:
    return TransformersEngine(demo_model, device="cpu", dtype="bfloat16", batch_tokens=64)


@pytest.fixture
def run(tmp_path: Path, demo_model: Path, demo_tokenizer: Any, engine: TransformersEngine) -> dict[str, Any]:
    cfg = PipelineConfig.model_validate({"run_dir": str(tmp_path / "run"), "model": str(demo_model)})
    store = RunStore(cfg.run_dir)
    samples = write_prepared(store, demo_tokenizer, demo_model, TEXTS)
    info = open_run(cfg, store, demo_model, engine.info)
    return {"cfg": cfg, "store": store, "samples": samples, "info": info}


def assert_store_complete(store: RunStore, samples: list[PreparedSample], info: RunInfo) -> None:
    m = store.read_manifest(0)
    assert m is not None and m.status == "complete" and not m.errors
    assert set(m.samples) == {s.sample_id for s in samples}
    assert m.tokens == sum(len(s) for s in samples)
    for s in samples:
        entry = store.verify(0, s, info, m.samples[s.sample_id].crc32)  # full check: ids, finite, checksum
        assert entry.num_tokens == len(s)
        back = store.open_sample(0, s.sample_id)
        assert back.loss_mask.tolist() == s.loss_mask


def test_open_run_records_the_model_the_layers_and_the_data(run: dict, demo_model: Path) -> None:
    info: RunInfo = run["info"]
    assert (info.hidden_size, info.num_layers, info.vocab_size, info.dtype) == (576, 30, 49152, "bfloat16")
    assert info.aux_layers == info.engine_layer_ids == [2, 15, 27]
    assert info.engine_layer_convention == "hf_hidden_states" and info.engine == "transformers"
    assert info.dataset_fingerprint == "fp-test" and info.tokenizer_sha256 == tokenizer_fingerprint(demo_model)
    assert "torch" in info.versions and info.config["model"] == str(demo_model)
    assert run["store"].read_run_info() == info


def test_extract_fills_the_shard_and_a_rerun_does_no_model_work(run: dict, engine: TransformersEngine) -> None:
    store, samples, info = run["store"], run["samples"], run["info"]
    counting = CountingEngine(engine)
    seen: list[Progress] = []
    m = extract_shard(store, 0, counting, info, seen.append)
    assert m.status == "complete" and len(counting.calls) == 1
    assert_store_complete(store, samples, info)
    assert seen[-1].done == len(samples) and seen[-1].tokens == m.tokens and seen[-1].skipped == 0
    assert shard_is_complete(store, 0, info)

    again = CountingEngine(engine)
    m2 = extract_shard(store, 0, again, info, seen.append)
    assert again.calls == [] and m2.samples == m.samples
    assert seen[-1].skipped == len(samples) and seen[-1].tokens == 0


def test_a_finished_shard_never_loads_the_model(run: dict, engine: TransformersEngine, demo_model: Path) -> None:
    store, info = run["store"], run["info"]
    extract_shard(store, 0, engine, info)
    lazy = TransformersEngine(demo_model, device="cpu")
    assert extract_shard(store, 0, lazy, info).status == "complete"
    assert not lazy.loaded


def test_deleting_one_file_redoes_exactly_that_sample(run: dict, engine: TransformersEngine) -> None:
    store, samples, info = run["store"], run["samples"], run["info"]
    extract_shard(store, 0, engine, info)
    before = {s.sample_id: store.sample_path(0, s.sample_id).stat().st_mtime_ns for s in samples}
    store.sample_path(0, "t002").unlink()
    assert not shard_is_complete(store, 0, info)
    counting = CountingEngine(engine)
    extract_shard(store, 0, counting, info)
    assert counting.calls == [["t002"]]
    assert_store_complete(store, samples, info)
    for s in samples:
        if s.sample_id != "t002":
            assert store.sample_path(0, s.sample_id).stat().st_mtime_ns == before[s.sample_id]


def test_a_kill_mid_shard_is_resumed_from_the_finished_files(run: dict, engine: TransformersEngine) -> None:
    """What a SIGKILL leaves: finished files, a temp file of the sample in flight, a stale manifest."""
    store, samples, info = run["store"], run["samples"], run["info"]
    extract_shard(store, 0, engine, info)
    m = store.read_manifest(0)
    m.status = "running"
    store.write_manifest(m)
    doomed = store.sample_path(0, "t004")
    (doomed.parent / f".{doomed.name}.abc.tmp").write_bytes(doomed.read_bytes()[:1000])
    doomed.unlink()
    counting = CountingEngine(engine)
    assert extract_shard(store, 0, counting, info).status == "complete"
    assert counting.calls == [["t004"]]
    assert list(doomed.parent.glob(".*.tmp")) == []
    assert_store_complete(store, samples, info)


def test_a_failed_sample_makes_the_shard_partial_with_its_reason_and_a_rerun_retries_it(
    run: dict, engine: TransformersEngine
) -> None:
    store, samples, info = run["store"], run["samples"], run["info"]
    m = extract_shard(store, 0, CountingEngine(engine, fail=["t001"]), info)
    assert m.status == "partial" and m.errors == {"t001": "injected failure for the test"}
    assert len(m.samples) == len(samples) - 1
    assert store.read_manifest(0).status == "partial"
    assert not shard_is_complete(store, 0, info)
    counting = CountingEngine(engine)
    assert extract_shard(store, 0, counting, info).status == "complete"
    assert counting.calls == [["t001"]]


def test_all_samples_failing_makes_the_shard_failed(run: dict, engine: TransformersEngine) -> None:
    ids = [s.sample_id for s in run["samples"]]
    m = extract_shard(run["store"], 0, CountingEngine(engine, fail=ids), run["info"])
    assert m.status == "failed" and set(m.errors) == set(ids) and not m.samples


def test_reopening_a_run_with_other_layers_or_dtype_is_refused(run: dict, demo_model: Path) -> None:
    cfg: PipelineConfig = run["cfg"]
    other = TransformersEngine(demo_model, device="cpu", aux_layers=[3, 15, 27])
    with pytest.raises(RunMismatchError, match=r"aux_layers.*\n.*new run_dir"):
        open_run(cfg, run["store"], demo_model, other.info)
    cfg32 = cfg.model_copy(update={"server": cfg.server.model_copy(update={"dtype": "float32"})})
    with pytest.raises(RunMismatchError, match="dtype"):
        open_run(cfg32, run["store"], demo_model, TransformersEngine(demo_model, device="cpu").info)
    with pytest.raises(RunMismatchError, match="layers"):
        extract_shard(run["store"], 0, other, run["info"])
    assert open_run(cfg, run["store"], demo_model, TransformersEngine(demo_model).info) == run["info"]


def test_a_writer_error_stops_the_shard_and_is_raised(run: dict) -> None:
    info: RunInfo = run["info"]
    wrong = ScriptedEngine(
        run_engine_info(info), lambda s: Captured(s, torch.zeros(len(s), 3, 576), torch.zeros(len(s), 576))
    )  # fp32 tensors for a bf16 store
    with pytest.raises(ValueError, match="expects"):
        extract_shard(run["store"], 0, wrong, info)
    m = run["store"].read_manifest(0)
    assert m.status == "failed" and "expects" in (m.log or "")


def test_dumped_files_are_verified_and_moved_in_and_bad_ones_rejected(run: dict, tmp_path: Path) -> None:
    store, samples, info = run["store"], run["samples"], run["info"]
    dump_dir = tmp_path / "dump"
    dump_dir.mkdir()

    def dump(s: PreparedSample) -> Dumped:
        t = len(s)
        ids = torch.tensor(s.input_ids) if s.sample_id != "t003" else torch.zeros(t, dtype=torch.long)  # wrong ids
        data = encode_sample(
            s.sample_id,
            info.aux_layers,
            ids,
            torch.tensor(s.loss_mask, dtype=torch.uint8),
            torch.randn(t, 3, 576).bfloat16(),
            torch.randn(t, 576).bfloat16(),
        )
        path = dump_dir / f"{s.sample_id}.safetensors"
        path.write_bytes(data)
        return Dumped(s, path)

    m = extract_shard(store, 0, ScriptedEngine(run_engine_info(info), dump), info)
    assert m.status == "partial" and list(m.errors) == ["t003"] and "token ids" in m.errors["t003"]
    assert len(m.samples) == len(samples) - 1 and list(dump_dir.iterdir()) == []


def run_engine_info(info: RunInfo) -> EngineInfo:
    return EngineInfo("scripted", "0", info.aux_layers, info.engine_layer_ids, info.engine_layer_convention)
