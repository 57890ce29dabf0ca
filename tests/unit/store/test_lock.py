"""RunLock: one writer per run directory; a killed holder's lock is taken over; two takers never both win."""

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

from eagle3.store.lock import LOCK_NAME, RunLock, RunLockedError, RunLockLostError, lock_state, read_owner

REPO = Path(__file__).resolve().parents[3]

_HOLDER = textwrap.dedent(
    """
    import sys, time
    from eagle3.store.lock import RunLock
    lock = RunLock(sys.argv[1], purpose="extract", flow_run_id="fr-123").acquire()
    print("held", flush=True)
    time.sleep(120)
    """
)


def start_holder(run_dir: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(run_dir)], stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_the_lock_file_names_its_owner_and_is_removed_on_exit(tmp_path: Path) -> None:
    with RunLock(tmp_path / "run", purpose="verify", flow_run_id="abc") as lock:
        owner = read_owner(tmp_path / "run" / LOCK_NAME)
        assert owner == lock.owner and owner.pid == os.getpid() and owner.purpose == "verify"
        assert owner.flow_run_id == "abc" and len(owner.token) == 16
        state = lock_state(tmp_path / "run")
        assert state is not None and state.stale is None
    assert not (tmp_path / "run" / LOCK_NAME).exists()
    assert lock_state(tmp_path / "run") is None
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == []  # no temp files left


def test_a_second_run_in_this_process_is_refused_naming_the_holder(tmp_path: Path) -> None:
    with RunLock(tmp_path, flow_run_id="first"), pytest.raises(RunLockedError) as e:
        RunLock(tmp_path).acquire()
    msg = str(e.value)
    assert f"pid {os.getpid()}" in msg and "flow run first" in msg and "since" in msg
    assert "eagle3 status" in msg and str(tmp_path / LOCK_NAME) in msg


def test_a_run_in_another_live_process_is_refused(tmp_path: Path) -> None:
    proc = start_holder(tmp_path)
    try:
        with pytest.raises(RunLockedError, match=rf"pid {proc.pid} on host .*extract, flow run fr-123"):
            RunLock(tmp_path).acquire()
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_a_lock_left_by_a_killed_process_is_taken_over_at_once(tmp_path: Path) -> None:
    proc = start_holder(tmp_path)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    state = lock_state(tmp_path)
    assert state is not None and state.stale is not None and "no live process" in state.stale
    with RunLock(tmp_path) as lock:
        assert lock.took_over is not None and lock.took_over.owner is not None
        assert lock.took_over.owner.pid == proc.pid
        assert read_owner(tmp_path / LOCK_NAME) == lock.owner
        assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK_NAME]  # no helper file of the takeover
    assert sorted(tmp_path.iterdir()) == []


def test_a_reused_pid_does_not_keep_a_dead_lock_alive(tmp_path: Path) -> None:
    """Same host, the recorded pid is alive (it is ours) but nobody holds the flock: stale."""
    owner = {"host": os.uname().nodename, "pid": os.getpid(), "started_at": "x", "token": "t" * 16,
             "purpose": "extract", "flow_run_id": None}  # fmt: skip
    (tmp_path / LOCK_NAME).write_text(json.dumps(owner))
    with RunLock(tmp_path, host=owner["host"]) as lock:  # type: ignore[arg-type]
        assert lock.took_over is not None


def test_another_hosts_lock_is_kept_while_it_beats_and_taken_over_after_the_ttl(tmp_path: Path) -> None:
    holder = RunLock(tmp_path, host="node-a", ttl_s=1.0, heartbeat_s=0.1).acquire()
    try:
        time.sleep(1.5)  # longer than the TTL, but the heartbeat keeps the mtime fresh
        with pytest.raises(RunLockedError, match="host node-a"):
            RunLock(tmp_path, host="node-b", ttl_s=1.0, heartbeat_s=0.1).acquire()
    finally:
        holder._stop.set()  # the holder "hangs": no more heartbeats, the lock stays
        holder._beat.join()  # type: ignore[union-attr]
    old = time.time() - 5
    os.utime(tmp_path / LOCK_NAME, (old, old))
    with RunLock(tmp_path, host="node-b", ttl_s=1.0, heartbeat_s=0.1) as taker:
        assert taker.took_over is not None and "no heartbeat" in (taker.took_over.stale or "")
        holder._start_heartbeat()  # the stalled holder wakes up and notices
        deadline = time.monotonic() + 5
        while holder.lost is None and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(RunLockLostError, match="node-b"):
            holder.check()
        holder.release()  # must not remove the new owner's lock
        assert read_owner(tmp_path / LOCK_NAME) == taker.owner


def test_an_unreadable_lock_file_counts_as_held_until_the_ttl(tmp_path: Path) -> None:
    (tmp_path / LOCK_NAME).write_text("")
    with pytest.raises(RunLockedError, match="unknown owner"):
        RunLock(tmp_path, ttl_s=60.0, heartbeat_s=1.0).acquire()
    old = time.time() - 120
    os.utime(tmp_path / LOCK_NAME, (old, old))
    with RunLock(tmp_path, ttl_s=60.0, heartbeat_s=1.0) as lock:
        assert lock.took_over is not None


def test_many_takers_of_one_stale_lock_give_exactly_one_winner(tmp_path: Path) -> None:
    proc = start_holder(tmp_path)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    winners: list[RunLock] = []
    refused: list[BaseException] = []
    barrier = threading.Barrier(6)

    def take() -> None:
        lock = RunLock(tmp_path)
        barrier.wait()
        try:
            winners.append(lock.acquire())
        except RunLockedError as e:
            refused.append(e)

    threads = [threading.Thread(target=take) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1 and len(refused) == 5
    assert read_owner(tmp_path / LOCK_NAME) == winners[0].owner
    winners[0].release()
    assert sorted(tmp_path.iterdir()) == []  # nothing left by six takers


def test_a_released_lock_can_be_taken_again_and_release_is_idempotent(tmp_path: Path) -> None:
    lock = RunLock(tmp_path)
    lock.acquire()
    lock.release()
    lock.release()
    with RunLock(tmp_path) as again:
        assert again.took_over is None


def test_a_heartbeat_longer_than_a_third_of_the_ttl_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="heartbeat_s"):
        RunLock(tmp_path, ttl_s=10.0, heartbeat_s=5.0)


def test_a_holder_that_releases_between_an_attempt_and_the_look_is_not_reported_as_a_holder(tmp_path: Path) -> None:
    """The fan-out race (CI, stop 21): a shared holder released after our create failed and before we read
    the file; that used to raise RunLockedError naming "an unknown owner"."""
    lock = RunLock(tmp_path, exclusive=False, wait_s=5.0)
    real, calls = lock.try_acquire, []

    def holder_then_gone() -> bool:
        calls.append(1)
        if len(calls) == 1:
            with RunLock(tmp_path, exclusive=False):
                pass  # another cooperating run held it and let go in between
            return False
        return real()

    lock.try_acquire = holder_then_gone  # type: ignore[method-assign]
    with lock:
        assert len(calls) == 2


def test_cooperating_shared_holders_that_come_and_go_never_refuse_each_other(tmp_path: Path) -> None:
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            for _ in range(30):
                with RunLock(tmp_path, exclusive=False, wait_s=30.0, purpose="open-run"):
                    time.sleep(0.001)
        except BaseException as e:  # collected and asserted below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
