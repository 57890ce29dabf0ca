"""Faults that need no server: a truncated file, a killed flow process, a full filesystem, malformed rows.

Each test breaks a store the way production does and checks the promise in docs/operations.md:
a file that exists is complete; a kill loses only samples in flight; a re-run redoes exactly what is
missing; verify catches damage; the disk guard stops before the reserve with no partial file.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from eagle3.config import DiskConfig, PipelineConfig
from eagle3.data.prepare import prepare
from eagle3.extract.disk import DiskBudgetError, DiskGuard, run_budget, shard_budget, store_size
from eagle3.extract.engines.base import Outcome
from eagle3.extract.engines.transformers_engine import TransformersEngine
from eagle3.extract.shard import extract_shard, open_run
from eagle3.store.failed_shards import failed_shards, plan_retry, plan_retry_samples
from eagle3.store.run_store import PreparedSample, RunInfo, RunStore
from eagle3.store.sample_format import check_header
from eagle3.store.verify import QUARANTINE, verify_run
from tests.unit.tiny_store import ScriptedEngine, make_store

REPO = Path(__file__).resolve().parents[2]
ASSETS = REPO / "tests" / "assets"
DEMO_PROMPTS = REPO / "data" / "demo_prompts.jsonl"
slow = pytest.mark.slow


class CountingEngine:
    """Wraps a real engine: records which samples each call asked for, and can fail chosen ones."""

    def __init__(self, inner: Any, fail: Sequence[str] = ()):
        self.inner, self.info, self.fail = inner, inner.info, set(fail)
        self.calls: list[list[str]] = []

    def extract(self, samples: Sequence[PreparedSample]) -> Iterator[Outcome]:
        from eagle3.extract.engines.base import Failed

        self.calls.append([s.sample_id for s in samples])
        for s in samples:
            if s.sample_id in self.fail:
                yield Failed(s, "injected server error after retries")
        yield from self.inner.extract([s for s in samples if s.sample_id not in self.fail])

    def close(self) -> None:
        pass


def disk_cfg(**kw: object) -> DiskConfig:
    return DiskConfig.model_validate(kw)


def sample_files(store: RunStore, shard: int = 0) -> list[str]:
    return sorted(p.stem for p in store.shard_dir(shard).glob("*.safetensors"))


def assert_no_partial_files(store: RunStore, info: RunInfo, shard: int = 0) -> None:
    """Every file in the shard is a complete sample of its prepared length; no temp file is left."""
    lengths = {s.sample_id: len(s) for s in store.prepared_samples(shard)}
    assert list(store.shard_dir(shard).glob(".*.tmp")) == []
    for sid in sample_files(store, shard):
        check_header(store.sample_path(shard, sid), num_tokens=lengths[sid], num_aux=len(info.aux_layers),
                     hidden_size=info.hidden_size, dtype=torch.bfloat16)  # fmt: skip


# the demo model ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def engine(demo_model: Path) -> TransformersEngine:
    return TransformersEngine(demo_model, device="cpu", dtype="bfloat16", batch_tokens=1)  # one sample per forward


def demo_run(
    root: Path, demo_model: Path, engine: TransformersEngine, dataset: Path, n: int, max_length: int = 512
) -> tuple[RunStore, RunInfo]:
    data = {"dataset": str(dataset), "max_samples": n, "max_length": max_length, "shard_size": 100}
    cfg = PipelineConfig.model_validate({"run_dir": str(root), "model": str(demo_model), "data": data})
    store = RunStore(cfg.run_dir)
    prepare(cfg, store, demo_model)
    return store, open_run(cfg, store, demo_model, engine.info)


@slow
def test_verify_finds_a_truncated_and_a_corrupt_demo_sample_and_a_retry_redoes_only_them(
    tmp_path: Path, demo_model: Path, engine: TransformersEngine
) -> None:
    store, info = demo_run(tmp_path / "run", demo_model, engine, DEMO_PROMPTS, 5)
    assert extract_shard(store, 0, engine, info).status == "complete"
    ids = sample_files(store)
    truncated, corrupt = store.sample_path(0, ids[1]), store.sample_path(0, ids[3])
    truncated.write_bytes(truncated.read_bytes()[:-100])
    data = bytearray(corrupt.read_bytes())
    data[-50] ^= 0x01
    corrupt.write_bytes(bytes(data))

    report = verify_run(store)
    assert report.bad_count == 2 and not report.clean
    assert set(report.shards[0].bad) == {ids[1], ids[3]}
    assert "truncated" in report.shards[0].bad[ids[1]] and "checksum" in report.shards[0].bad[ids[3]]
    assert len(list((store.root / QUARANTINE / "shard-00000").iterdir())) == 2
    assert [s.shard for s in failed_shards(store)] == [0] and plan_retry(store) == [0]
    assert {k: sorted(v) for k, v in plan_retry_samples(store).items()} == {0: sorted([ids[1], ids[3]])}

    counting = CountingEngine(engine)
    assert extract_shard(store, 0, counting, info).status == "complete"
    assert len(counting.calls) == 1 and sorted(counting.calls[0]) == sorted([ids[1], ids[3]])
    assert verify_run(store).clean and plan_retry(store) == []


_KILLED_EXTRACT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from eagle3.extract.engines.transformers_engine import TransformersEngine
    from eagle3.extract.shard import extract_shard
    from eagle3.store.run_store import RunStore

    class Slow:  # a slow server: time to kill the process mid-shard
        def __init__(self, inner):
            self.inner, self.info = inner, inner.info
        def extract(self, samples):
            for outcome in self.inner.extract(samples):
                yield outcome
                time.sleep(0.4)
        def close(self):
            pass

    store = RunStore(sys.argv[1])
    engine = TransformersEngine(Path(sys.argv[2]), device="cpu", dtype="bfloat16", batch_tokens=1)
    extract_shard(store, 0, Slow(engine), store.read_run_info(), manifest_every_s=0.0)
    print("finished", flush=True)
    """
)


@slow
def test_a_flow_process_killed_mid_shard_is_finished_by_a_rerun_with_nothing_lost_or_duplicated(
    tmp_path: Path, demo_model: Path, engine: TransformersEngine
) -> None:
    n = 10
    store, info = demo_run(tmp_path / "killed", demo_model, engine, DEMO_PROMPTS, n)
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_EXTRACT, str(store.root), str(demo_model)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while len(sample_files(store)) < 3 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, f"the extract finished or died before the kill: {proc.communicate()[0]}"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=60)
    survivors = sample_files(store)
    assert 3 <= len(survivors) < n, survivors
    assert_no_partial_files(store, info)  # a temp file may remain: the re-run removes it
    manifest = store.read_manifest(0)
    assert manifest is not None and manifest.status == "running"  # what a kill leaves

    counting = CountingEngine(engine)
    assert extract_shard(store, 0, counting, info).status == "complete"
    prepared = [s.sample_id for s in store.prepared_samples(0)]
    assert len(counting.calls) == 1 and sorted(counting.calls[0]) == sorted(set(prepared) - set(survivors))
    assert sample_files(store) == sorted(prepared)  # each sample exactly once, nothing else
    assert list(store.shard_dir(0).glob(".*")) == []
    assert verify_run(store).clean

    clean, clean_info = demo_run(tmp_path / "clean", demo_model, engine, DEMO_PROMPTS, n)
    assert extract_shard(clean, 0, engine, clean_info).status == "complete"
    assert store.read_manifest(0).tokens == clean.read_manifest(0).tokens  # type: ignore[union-attr]
    for sid in prepared:
        a, b = store.open_sample(0, sid), clean.open_sample(0, sid)
        assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.loss_mask, b.loss_mask)
        torch.testing.assert_close(a.aux_hidden_states, b.aux_hidden_states, atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(a.last_hidden_state, b.last_hidden_state, atol=2e-2, rtol=2e-2)


@slow
def test_malformed_rows_are_reported_per_row_while_the_rest_is_extracted(
    tmp_path: Path, demo_model: Path, engine: TransformersEngine
) -> None:
    store, info = demo_run(tmp_path / "run", demo_model, engine, ASSETS / "prepare_bad_rows.jsonl", 100, 64)
    prepared = store.read_prepared_manifest()
    assert prepared is not None and prepared.num_samples == 2 and len(prepared.bad_rows) >= 8
    assert all(b.file.endswith("prepare_bad_rows.jsonl") and b.reason for b in prepared.bad_rows)
    rows = {b.row for b in prepared.bad_rows}
    assert {2, 3, 4, 8}.issubset(rows)  # unknown schema, empty, no assistant turn, broken JSON

    ids = [s.sample_id for s in store.prepared_samples(0)]
    m = extract_shard(store, 0, CountingEngine(engine, fail=[ids[0]]), info)
    assert m.status == "partial" and list(m.samples) == [ids[1]]
    assert m.errors == {ids[0]: "injected server error after retries"}
    summary = failed_shards(store)[0]
    assert summary.first_error == f"{ids[0]}: injected server error after retries" and summary.failed == 1
    assert plan_retry_samples(store) == {0: [ids[0]]}
    counting = CountingEngine(engine)
    assert extract_shard(store, 0, counting, info).status == "complete" and counting.calls == [[ids[0]]]


# a small filesystem ------------------------------------------------------------------------
@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A real 2 MB filesystem (tmpfs). Skips where mounting is not permitted (the budget test covers that)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


H = 64  # a sample of 200 tokens: 200 x 4 x 64 x 2 bytes + ids, mask, header = about 104 kB


def test_on_a_small_filesystem_the_guards_stop_before_writing_and_leave_no_partial_files(small_fs: Path) -> None:
    store, info = make_store(small_fs / "run", [[200] * 30, [200] * 12], hidden_size=H)
    cfg = disk_cfg(reserve_fraction=0.1, reserve_min_gb=0)

    with pytest.raises(DiskBudgetError, match=r"the run needs 4\.\d+ MB in the store") as e:
        run_budget(store, info, None, cfg)  # 42 samples do not fit in 2 MB
    assert e.value.check.total_bytes == 2 * 1024 * 1024
    with pytest.raises(DiskBudgetError, match="shard 0 needs"):
        shard_budget(store, info, 0, cfg)
    assert not store.shard_dir(0).exists()  # refused before writing anything
    shard_budget(store, info, 1, cfg)  # 12 samples fit

    filler = small_fs / "another-process.bin"

    def fill_disk(i: int, _: object) -> None:  # another process fills the disk after four samples
        if i == 4:
            deadline = time.monotonic() + 30
            while len(sample_files(store, 1)) < 4 and time.monotonic() < deadline:
                time.sleep(0.01)
            filler.write_bytes(b"\0" * (1024 * 1024))

    guard = DiskGuard(store, cfg, scope="shard 1", check_every_bytes=0)
    with pytest.raises(DiskBudgetError, match=r"shard 1 needs .* may be used"):  # the guard, not ENOSPC
        extract_shard(store, 1, ScriptedEngine(info, before=fill_disk), info, guard=guard, writer_threads=1)
    written = sample_files(store, 1)
    assert 4 <= len(written) < 12
    assert_no_partial_files(store, info, 1)
    m = store.read_manifest(1)
    assert m is not None and m.status == "failed" and "DiskBudgetError" in (m.log or "")
    assert sorted(m.samples) == written and plan_retry(store) == [1]

    filler.unlink()
    engine = ScriptedEngine(info)
    assert extract_shard(store, 1, engine, info, guard=DiskGuard(store, cfg, check_every_bytes=0)).status == "complete"
    assert engine.calls == [[s for s in (f"s1-{n:03d}" for n in range(12)) if s not in written]]
    assert verify_run(store, shards=[1]).clean


def test_the_store_budget_cap_stops_a_shard_cleanly_where_mounts_are_not_possible(tmp_path: Path) -> None:
    store, info = make_store(tmp_path / "run", [[200] * 12], hidden_size=H)
    cap = store_size(store) + 5 * 110_000  # room for about five samples
    cfg = disk_cfg(reserve_fraction=0.0, reserve_min_gb=0, budget_gb=cap / 1e9)
    with pytest.raises(DiskBudgetError, match=r"disk\.budget_gb"):
        shard_budget(store, info, 0, cfg)
    with pytest.raises(DiskBudgetError, match=r"Raise disk\.budget_gb") as e:
        extract_shard(store, 0, ScriptedEngine(info), info, guard=DiskGuard(store, cfg), writer_threads=1)
    assert e.value.check.budget_limits
    written = sample_files(store)
    assert 3 <= len(written) <= 5 and store_size(store) <= cap
    assert_no_partial_files(store, info)
    m = store.read_manifest(0)
    assert m is not None and m.status == "failed" and sorted(m.samples) == written
