"""Shard leases (eagle3/store/lease.py): one live holder per shard, a killed holder's lease taken over, expiry on
another host, and the exclusion between leases and the run directory's exclusive lock."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from eagle3.store.lease import ShardLease, ShardLeaseLostError, lease_path
from eagle3.store.lock import LOCK_NAME, RunLock, RunLockedError, live_leases, read_owner

REPO = Path(__file__).resolve().parents[3]

_HOLDER = textwrap.dedent(
    """
    import sys, time
    from eagle3.store.lease import ShardLease
    from eagle3.store.lock import RunLock
    if sys.argv[2] == "lock":
        RunLock(sys.argv[1], purpose="verify").acquire()
    else:
        assert ShardLease(sys.argv[1], int(sys.argv[2]), flow_run_id="fr-9").try_acquire()
    print("held", flush=True)
    time.sleep(120)
    """
)


def start_holder(run_dir: Path, what: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(run_dir), what], stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def stop(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.wait(timeout=30)


def test_a_lease_file_names_owner_host_pid_and_expiry_and_goes_on_release(tmp_path: Path) -> None:
    with ShardLease(tmp_path, 3, flow_run_id="fr-1", ttl_s=90.0, heartbeat_s=1.0) as lease:
        assert lease.try_acquire()
        raw = json.loads(lease_path(tmp_path, 3).read_text())
        assert raw["pid"] == os.getpid() and raw["host"] == os.uname().nodename
        assert raw["ttl_s"] == 90.0 and raw["flow_run_id"] == "fr-1" and raw["purpose"] == "extract shard 3"
        state = lease.state()
        assert state is not None and state.stale is None and 85.0 < state.expires_in_s <= 90.0
        assert [p for p, _ in live_leases(tmp_path)] == [lease_path(tmp_path, 3)]
    assert not lease_path(tmp_path, 3).exists() and live_leases(tmp_path) == []
    assert [p.name for p in (tmp_path / "leases").iterdir()] == []  # no temporary files left


def test_a_shard_leased_by_a_live_process_is_refused_and_other_shards_are_free(tmp_path: Path) -> None:
    proc = start_holder(tmp_path, "0")
    try:
        lease = ShardLease(tmp_path, 0)
        assert not lease.try_acquire()
        state = lease.state()
        assert state is not None and state.owner is not None and state.owner.pid == proc.pid
        assert state.stale is None and "flow run fr-9" in state.describe()
        with ShardLease(tmp_path, 1) as other:
            assert other.try_acquire()
    finally:
        stop(proc)


def test_a_killed_owners_lease_is_taken_over_at_once(tmp_path: Path) -> None:
    proc = start_holder(tmp_path, "2")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    with ShardLease(tmp_path, 2) as lease:
        assert lease.try_acquire()
        assert lease.took_over is not None and lease.took_over.owner is not None
        assert lease.took_over.owner.pid == proc.pid and "no live process" in (lease.took_over.stale or "")
        assert read_owner(lease_path(tmp_path, 2)) == lease.owner
        assert sorted(p.name for p in lease_path(tmp_path, 2).parent.iterdir()) == [lease_path(tmp_path, 2).name]


def test_another_hosts_lease_lives_while_it_beats_and_expires_after_its_own_ttl(tmp_path: Path) -> None:
    holder = ShardLease(tmp_path, 0, host="node-a", ttl_s=1.0, heartbeat_s=0.1)
    assert holder.try_acquire()
    try:
        time.sleep(1.5)  # past the TTL, but the heartbeat keeps it fresh
        assert not ShardLease(tmp_path, 0, host="node-b", ttl_s=3600.0, heartbeat_s=1.0).try_acquire()
    finally:
        holder._stop.set()  # node-a hangs: no more heartbeats
        holder._beat.join()  # type: ignore[union-attr]
    old = time.time() - 5
    os.utime(lease_path(tmp_path, 0), (old, old))
    # node-b's own TTL is an hour, but the lease expires by the TTL its holder recorded (1 s)
    taker = ShardLease(tmp_path, 0, host="node-b", ttl_s=3600.0, heartbeat_s=1.0)
    assert taker.try_acquire()
    try:
        assert taker.took_over is not None and "no heartbeat" in (taker.took_over.stale or "")
        holder._start_heartbeat()  # node-a wakes up and notices
        deadline = time.monotonic() + 5
        while holder.lost is None and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(ShardLeaseLostError, match="node-b"):
            holder.check()
        holder.release()  # must not remove the new owner's lease
        assert read_owner(lease_path(tmp_path, 0)) == taker.owner
    finally:
        taker.release()


def test_many_takers_of_one_shard_give_exactly_one_winner(tmp_path: Path) -> None:
    leases = [ShardLease(tmp_path, 5) for _ in range(6)]
    won: list[bool] = []
    barrier = threading.Barrier(len(leases))

    def take(lease: ShardLease) -> None:
        barrier.wait()
        won.append(lease.try_acquire())

    threads = [threading.Thread(target=take, args=(lease,)) for lease in leases]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(won) == [False] * 5 + [True]
    for lease in leases:
        lease.release()


def test_an_exclusive_run_lock_refuses_while_another_process_holds_a_lease(tmp_path: Path) -> None:
    proc = start_holder(tmp_path, "4")
    try:
        with pytest.raises(RunLockedError, match=rf"shard lease shard-00004.lease held by pid {proc.pid}"):
            RunLock(tmp_path, purpose="verify").acquire()
        assert not (tmp_path / LOCK_NAME).exists()  # given back
        with RunLock(tmp_path, purpose="open-run", exclusive=False):
            pass  # the shared guard of cooperating runs does not mind leases
    finally:
        stop(proc)


def test_a_lease_is_refused_under_another_runs_exclusive_lock_but_allowed_under_its_own(tmp_path: Path) -> None:
    proc = start_holder(tmp_path, "lock")
    try:
        lease = ShardLease(tmp_path, 0)
        with pytest.raises(RunLockedError, match=rf"locked by pid {proc.pid}.*verify"):
            lease.try_acquire()
        assert not lease.held and not lease_path(tmp_path, 0).exists()
    finally:
        stop(proc)
    with RunLock(tmp_path) as mine, ShardLease(tmp_path, 0, under=mine) as lease:
        assert lease.try_acquire()


def test_a_shared_guard_waits_for_another_shared_holder_and_refuses_an_exclusive_one(tmp_path: Path) -> None:
    first = RunLock(tmp_path, purpose="open-run", exclusive=False).acquire()
    threading.Timer(0.5, first.release).start()
    start = time.monotonic()
    with RunLock(tmp_path, purpose="open-run", exclusive=False, wait_s=30.0):
        assert time.monotonic() - start >= 0.4
    with RunLock(tmp_path, purpose="extract"), pytest.raises(RunLockedError, match="extract"):
        RunLock(tmp_path, purpose="open-run", exclusive=False, wait_s=30.0).acquire()
