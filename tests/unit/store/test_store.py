"""The store on disk: atomic writes survive a kill, names stay inside the store, resume checks headers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from eagle3.store.fsio import atomic_write_bytes, remove_stale_temps, safe_name
from eagle3.store.run_store import PreparedSample, RunInfo, RunStore, SampleEntry, ShardManifest
from eagle3.store.sample_format import encode_sample, write_sample

T, K, H = 5, 3, 8
REPO = Path(__file__).resolve().parents[3]


def run_info(**kw: object) -> RunInfo:
    fields: dict = dict(
        model_path="m", model_sha256="a" * 64, tokenizer_sha256="b" * 64, engine="transformers",
        engine_version="5", dtype="bfloat16", hidden_size=H, num_layers=8, vocab_size=100,
        aux_layers=[2, 4, 5], engine_layer_ids=[2, 4, 5], engine_layer_convention="hf_hidden_states",
        dataset_fingerprint="d", versions={}, config={},
    )  # fmt: skip
    fields.update(kw)
    return RunInfo(**fields)


def sample(sid: str = "s-1", t: int = T) -> PreparedSample:
    return PreparedSample(sid, list(range(10, 10 + t)), [0] * (t - 2) + [1, 1], "f.jsonl:0")


def sample_bytes(s: PreparedSample, dtype: torch.dtype = torch.bfloat16, k: int = K) -> bytes:
    t = len(s)
    return encode_sample(
        s.sample_id, [2, 4, 5][:k], torch.tensor(s.input_ids), torch.tensor(s.loss_mask, dtype=torch.uint8),
        torch.ones(t, k, H, dtype=dtype), torch.ones(t, H, dtype=dtype),
    )  # fmt: skip


def test_existing_ok_accepts_a_complete_sample_and_refuses_a_mismatched_one(tmp_path: Path) -> None:
    store, s, info = RunStore(tmp_path), sample(), run_info()
    assert store.existing_ok(0, s, info) is None  # absent
    write_sample(store.sample_path(0, s.sample_id), sample_bytes(s))
    assert store.existing_ok(0, s, info) == T
    assert store.existing_ok(0, sample(t=T + 1), info) is None  # prepared length changed
    assert store.existing_ok(0, s, run_info(hidden_size=H * 2)) is None
    write_sample(store.sample_path(0, s.sample_id), sample_bytes(s, dtype=torch.float16))
    assert store.existing_ok(0, s, info) is None
    write_sample(store.sample_path(0, s.sample_id), sample_bytes(s, k=2))
    assert store.existing_ok(0, s, info) is None


def test_store_verify_returns_the_manifest_entry_and_checks_token_ids(tmp_path: Path) -> None:
    store, s, info = RunStore(tmp_path), sample(), run_info()
    data = sample_bytes(s)
    rec = write_sample(store.sample_path(0, s.sample_id), data)
    entry = store.verify(0, s, info, rec.crc32)
    assert entry == SampleEntry(num_tokens=T, num_bytes=len(data), crc32=rec.crc32)
    other = PreparedSample(s.sample_id, [1] * T, s.loss_mask, s.source)
    with pytest.raises(ValueError, match="token ids"):
        store.verify(0, other, info, None)


_KILLED_WRITER = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from eagle3.store import fsio
    def hang(fd):  # data is written but not yet renamed: the moment a kill hurts most
        print("writing", flush=True)
        time.sleep(60)
    fsio.os.fsync = hang
    fsio.atomic_write_bytes(Path(sys.argv[1]), b"N" * (8 << 20))
    """
)


def test_a_writer_killed_mid_write_leaves_no_file_that_looks_complete(tmp_path: Path) -> None:
    store, s, info = RunStore(tmp_path), sample(), run_info()
    path = store.sample_path(0, s.sample_id)
    old = sample_bytes(s)
    write_sample(path, old)
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER, str(path)], stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "writing"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert path.read_bytes() == old  # the old complete file, never a half-new one
    temps = list(path.parent.glob(".*.tmp"))
    assert len(temps) == 1 and temps[0].stat().st_size > 0
    assert store.existing_ok(0, s, info) == T
    assert remove_stale_temps(path.parent) == 1
    assert list(path.parent.iterdir()) == [path]


def test_a_leftover_temp_file_is_never_taken_for_a_sample(tmp_path: Path) -> None:
    store, s, info = RunStore(tmp_path), sample(), run_info()
    path = store.sample_path(0, s.sample_id)
    path.parent.mkdir(parents=True)
    (path.parent / f".{path.name}.x.tmp").write_bytes(sample_bytes(s))  # even a whole one
    assert store.existing_ok(0, s, info) is None
    assert remove_stale_temps(path.parent) == 1


def test_atomic_write_cleans_up_its_temp_file_when_the_write_fails(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        atomic_write_bytes(tmp_path / "x.bin", 12345)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("raw", ["../../etc/passwd", "/abs/path", "a/../../b", "..\\..\\win", "ok-id.1"])
def test_sample_ids_cannot_leave_the_shard_directory(tmp_path: Path, raw: str) -> None:
    store = RunStore(tmp_path)
    name = safe_name(raw)
    assert "/" not in name and "\\" not in name
    path = store.sample_path(3, raw)
    assert path.parent == store.shard_dir(3)
    assert path.resolve().is_relative_to(store.shard_dir(3).resolve())


@pytest.mark.parametrize("raw", ["", ".", "..", "...", "/"])
def test_ids_that_sanitise_to_nothing_or_dots_are_refused(raw: str) -> None:
    if raw == "/":
        assert safe_name(raw) == "_"
        return
    with pytest.raises(ValueError, match="file name"):
        safe_name(raw)


def test_manifest_totals_are_recomputed_from_its_entries(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    m = ShardManifest(shard=2, expected=3, status="partial", errors={"c": "boom"})
    m.samples = {
        "a": SampleEntry(num_tokens=4, num_bytes=100, crc32="0"),
        "b": SampleEntry(num_tokens=6, num_bytes=50, crc32="1"),
    }
    m.tokens = 999
    store.write_manifest(m)
    back = store.read_manifest(2)
    assert back is not None and (back.tokens, back.bytes, back.errors) == (10, 150, {"c": "boom"})


def test_run_info_round_trips_and_refuses_unknown_fields(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    store.write_run_info(run_info())
    assert store.read_run_info() == run_info(created_at=store.read_run_info().created_at)  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="extra"):
        RunInfo.model_validate({**run_info().model_dump(), "surprise": 1})
