"""Who may write a run directory: the run lock of a flow run, and the shard leases of its shard tasks.

run_lock(run_dir, purpose, shared=False)   exclusive (default): the flow run holds RUN_DIR/.lock to its end,
                                           and a second run is refused (RunLockedError)
                                           shared (extract.share_run_dir): a guard held only until `opened()`
                                           (run.json written); other shared flow runs wait for it, then
                                           extract the same directory, shard by shard
shard_lease(config, shard)                 the lease a shard task holds while it extracts (eagle3.lease)
check_lock(run_dir)                        RunLockLostError when this process's exclusive lock was taken over
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from prefect import get_run_logger
from prefect.runtime import flow_run

from eagle3.config import PipelineConfig
from eagle3.lease import ShardLease
from eagle3.lock import RunLock

OPEN_WAIT_S = 20 * 60  # a shared guard waits this long for another flow run's open-run (it hashes the model)
_LOCKS: dict[str, RunLock] = {}  # resolved run_dir -> the exclusive lock this process's flow holds


def heartbeat_of(ttl_s: float) -> float:
    return min(30.0, ttl_s / 20)


class RunHold:
    """A flow run's hold on its run directory; `opened()` ends a shared one (the directory stays open to others)."""

    def __init__(self, lock: RunLock):
        self.lock = lock
        self.shared = not lock.owner.exclusive

    def opened(self) -> None:
        if self.shared:
            self.lock.release()


@contextmanager
def run_lock(run_dir: str, purpose: str, *, shared: bool = False, ttl_s: float = 600.0) -> Iterator[RunHold]:
    """Hold `run_dir` for this flow run (RunLockedError when another live run holds it exclusively; a stale lock
    is taken over). The lock heartbeats in its own thread; shard tasks call `check_lock()` before writing."""
    lock = RunLock(
        run_dir,
        purpose="open-run" if shared else purpose,
        flow_run_id=flow_run.get_id(),
        ttl_s=ttl_s,
        heartbeat_s=heartbeat_of(ttl_s),
        exclusive=not shared,
        wait_s=OPEN_WAIT_S if shared else 0.0,
    ).acquire()
    key = str(Path(run_dir).resolve())
    if not shared:
        _LOCKS[key] = lock
    try:
        if lock.took_over is not None:
            get_run_logger().warning("%s: took over a stale lock (%s)", run_dir, lock.took_over.describe())
        yield RunHold(lock)
    finally:
        if not shared:
            _LOCKS.pop(key, None)
        lock.release()


def check_lock(run_dir: str) -> None:
    """Raise RunLockLostError when this process's lock on `run_dir` was taken over (no-op without one)."""
    lock = _LOCKS.get(str(Path(run_dir).resolve()))
    if lock is not None:
        lock.check()


def shard_lease(config: PipelineConfig, shard: int) -> ShardLease:
    """The (not yet taken) lease on `shard`, under this process's exclusive lock on the run directory if any."""
    ttl = config.extract.lease_ttl_s
    return ShardLease(
        config.run_dir,
        shard,
        flow_run_id=flow_run.get_id(),
        ttl_s=ttl,
        heartbeat_s=heartbeat_of(ttl),
        under=_LOCKS.get(str(Path(config.run_dir).resolve())),
    )
