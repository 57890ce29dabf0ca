"""Disk budget: estimates bound the real files, checks name the numbers and the fix, the guard stops cleanly."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from eagle3.config import DiskConfig
from eagle3.extract import disk
from eagle3.extract.disk import (
    GB,
    DiskBudgetError,
    DiskGuard,
    check_budget,
    estimate_bytes,
    run_budget,
    same_filesystem,
    shard_budget,
    shard_need,
    store_size,
)
from eagle3.extract.shard import extract_shard
from eagle3.store.sample_format import check_header, encode_sample
from tests.unit.tiny_store import ScriptedEngine, make_store


def disk_cfg(**kw: object) -> DiskConfig:
    return DiskConfig.model_validate(kw)


NO_RESERVE = disk_cfg(reserve_fraction=0.0, reserve_min_gb=0.0)


class FakeDisk:
    """Replaces statvfs: `free` bytes free of `total`; counts measurements."""

    def __init__(self, free: int, total: int = 10**12):
        self.free, self.total, self.calls = free, total, 0

    def __call__(self, path: Path) -> tuple[int, int]:
        self.calls += 1
        return self.free, self.total


@pytest.mark.parametrize(("t", "k", "h"), [(1, 3, 8), (5, 3, 8), (300, 3, 64), (1000, 5, 576)])
def test_the_estimate_bounds_a_real_sample_file_tightly(t: int, k: int, h: int) -> None:
    data = encode_sample(
        "f" * 160, list(range(100, 100 + k)), torch.zeros(t, dtype=torch.int64), torch.zeros(t, dtype=torch.uint8),
        torch.zeros(t, k, h, dtype=torch.bfloat16), torch.zeros(t, h, dtype=torch.bfloat16),
    )  # fmt: skip
    est = estimate_bytes(t, k, h, 2)
    assert len(data) <= est <= len(data) + disk.FILE_OVERHEAD_BYTES
    assert estimate_bytes(10 * t, k, h, 2, num_files=10) == 10 * est


def test_the_reserve_is_a_share_of_the_filesystem_and_at_least_the_minimum(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(disk, "fs_usage", FakeDisk(free=200 * 10**9, total=1000 * 10**9))
    c = check_budget(tmp_path, 10**9, disk_cfg(reserve_fraction=0.1, reserve_min_gb=5))
    assert c.reserve_bytes == 100 * 10**9 and c.available_bytes == 100 * 10**9 and c.ok
    c = check_budget(tmp_path, 10**9, disk_cfg(reserve_fraction=0.01, reserve_min_gb=50))
    assert c.reserve_bytes == 50 * 10**9 and c.available_bytes == 150 * 10**9
    c = check_budget(tmp_path, 10**12, disk_cfg())
    assert not c.ok


def test_the_default_reserve_lets_a_small_run_use_a_large_shared_filesystem_with_little_free(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CI's disk once: 21 GB free of 271 GB. A reserve of a tenth of the size (27 GB) refused a 1.3 MB run."""
    monkeypatch.setattr(disk, "fs_usage", FakeDisk(free=21 * 10**9, total=271 * 10**9))
    c = check_budget(tmp_path, 1_300_000, DiskConfig())
    assert c.ok and c.reserve_bytes == int(0.02 * 271 * 10**9) and c.available_bytes > 15 * 10**9


def test_a_failed_check_says_what_is_needed_free_reserved_and_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(disk, "fs_usage", FakeDisk(free=40 * 10**9, total=500 * 10**9))
    c = check_budget(tmp_path, 12 * 10**9, disk_cfg(reserve_fraction=0.1, reserve_min_gb=5), scope="shard 3")
    assert not c.ok
    msg = str(DiskBudgetError(c))
    parts = ["shard 3 needs 12.00 GB", "40.00 GB free of 500.00 GB", "reserve of 50.00 GB", "run_dir",
             "disk.reserve_fraction=0.1", "disk.reserve_min_gb=5", str(tmp_path), "extract.shards"]  # fmt: skip
    for part in parts:
        assert part in msg, part
    payload = c.as_event_payload()
    assert json.loads(json.dumps(payload)) == payload
    assert payload["need_bytes"] == 12 * 10**9 and payload["free_bytes"] == 40 * 10**9 and payload["ok"] is False
    assert payload["reserve_bytes"] == 50 * 10**9 and payload["available_bytes"] == 0


def test_the_budget_cap_counts_what_the_store_already_holds(tmp_path: Path) -> None:
    store, _ = make_store(tmp_path / "run", [[100] * 4])
    used = store_size(store)
    assert used > 0
    cfg = disk_cfg(reserve_fraction=0.0, reserve_min_gb=0.0, budget_gb=(used + 1000) / GB)
    assert check_budget(store.root, 1000, cfg, store_bytes=used).ok
    c = check_budget(store.root, 1001, cfg, store_bytes=used)
    assert not c.ok and c.budget_limits and c.available_bytes == 1000
    assert "Raise disk.budget_gb" in str(DiskBudgetError(c))


def test_the_run_check_counts_only_what_the_manifests_do_not_list(tmp_path: Path) -> None:
    store, info = make_store(tmp_path / "run", [[10, 20], [30]])
    est = disk.run_estimate
    checks = run_budget(store, info, None, NO_RESERVE)
    assert checks[0].need_bytes == est(info, 60, 3) and checks[0].scope == "the run"
    assert run_budget(store, info, [1], NO_RESERVE)[0].need_bytes == est(info, 30, 1)
    extract_shard(store, 0, ScriptedEngine(info), info)
    assert run_budget(store, info, None, NO_RESERVE)[0].need_bytes == est(info, 30, 1)
    with pytest.raises(DiskBudgetError, match=r"the run \(shards \[1\]\) needs") as e:
        run_budget(store, info, [1], disk_cfg(reserve_fraction=0.999999, reserve_min_gb=0))
    assert e.value.check.where == "store"


def test_the_shard_check_counts_the_samples_without_a_file(tmp_path: Path) -> None:
    store, info = make_store(tmp_path / "run", [[10, 20, 30]])
    assert shard_need(store, info, 0) == (disk.run_estimate(info, 60, 3), 30)
    extract_shard(store, 0, ScriptedEngine(info), info)
    store.sample_path(0, "s0-001").unlink()
    assert shard_need(store, info, 0) == (disk.run_estimate(info, 20, 1), 20)
    assert shard_budget(store, info, 0, NO_RESERVE)[0].scope == "shard 0"


def test_a_dump_directory_on_another_filesystem_is_checked_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or same_filesystem(shm, tmp_path):
        pytest.skip("needs /dev/shm on a filesystem other than the test's tmp dir")
    store, info = make_store(tmp_path / "run", [[10, 40]], max_length=50)
    checks = run_budget(store, info, None, NO_RESERVE, dump_dir=shm / "e3-test-dump", in_flight=4)
    assert [c.where for c in checks] == ["store", "dump"]
    assert checks[1].need_bytes == 4 * disk.run_estimate(info, 50)
    checks = shard_budget(store, info, 0, NO_RESERVE, dump_dir=shm, in_flight=2)
    assert checks[1].need_bytes == 2 * disk.run_estimate(info, 40)
    same = run_budget(store, info, None, NO_RESERVE, dump_dir=tmp_path / "run" / "dump")
    assert [c.where for c in same] == ["store"]  # same filesystem: a rename, no extra space
    real = disk.fs_usage
    monkeypatch.setattr(disk, "fs_usage", lambda p: (100, 10**9) if str(p).startswith("/dev/shm") else real(p))
    with pytest.raises(DiskBudgetError, match=r"in the dump directory /dev/shm.*extract.window.*extract.dump_dir"):
        run_budget(store, info, None, NO_RESERVE, dump_dir=shm)


def test_the_guard_measures_rarely_while_far_from_the_edge(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store, _ = make_store(tmp_path / "run", [[1]])
    fake = FakeDisk(free=10**12)
    monkeypatch.setattr(disk, "fs_usage", fake)
    guard = DiskGuard(store, NO_RESERVE, check_every_bytes=100 * disk.MB, check_every_s=3600)
    for _ in range(1000):
        guard(disk.MB)  # 1000 MB written
    assert fake.calls == 10 and guard.written == 1000 * disk.MB


def test_the_guard_stops_when_another_process_fills_the_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store, _ = make_store(tmp_path / "run", [[1]])
    fake = FakeDisk(free=10 * disk.MB)
    monkeypatch.setattr(disk, "fs_usage", fake)
    guard = DiskGuard(store, NO_RESERVE, scope="a write in shard 0", check_every_bytes=100 * disk.MB)
    for _ in range(9):
        guard(disk.MB)
    assert fake.calls == 1
    fake.free = disk.MB // 2  # someone else wrote 8.5 MB: the next write no longer fits the counted-down estimate
    guard(disk.MB // 4)  # fits our own count (1 MB left): no statvfs
    with pytest.raises(DiskBudgetError, match=r"a write in shard 0 needs 1\.05 MB") as e:
        guard(disk.MB)
    assert e.value.check.free_bytes == disk.MB // 2 and fake.calls == 2


def test_extract_with_a_guard_that_trips_keeps_finished_files_and_leaves_no_partial_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, info = make_store(tmp_path / "run", [[50] * 6])
    fake = FakeDisk(free=10**9)
    monkeypatch.setattr(disk, "fs_usage", fake)

    def fill_disk(i: int, _: object) -> None:
        if i == 3:  # once the first three are on disk (the writer runs behind the engine), the disk fills up
            deadline = time.monotonic() + 30
            while len(list(store.shard_dir(0).glob("*.safetensors"))) < 3 and time.monotonic() < deadline:
                time.sleep(0.01)
            fake.free = 0

    guard = DiskGuard(store, NO_RESERVE, scope="shard 0", check_every_bytes=0)
    with pytest.raises(DiskBudgetError):
        extract_shard(store, 0, ScriptedEngine(info, before=fill_disk), info, guard=guard, writer_threads=1)
    m = store.read_manifest(0)
    assert m is not None and m.status == "failed" and m.log is not None and "DiskBudgetError" in m.log
    files = sorted(store.shard_dir(0).glob("*.safetensors"))
    assert len(files) == 3 and set(m.samples) == {f.stem for f in files}
    assert list(store.shard_dir(0).glob(".*.tmp")) == []
    for f in files:
        check_header(f, num_tokens=50, num_aux=3, hidden_size=info.hidden_size, dtype=torch.bfloat16)
    fake.free = 10**9
    engine = ScriptedEngine(info)
    assert extract_shard(store, 0, engine, info, guard=guard).status == "complete"
    assert engine.calls == [[f"s0-{n:03d}" for n in range(6) if f"s0-{n:03d}" not in m.samples]]
