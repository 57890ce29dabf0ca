"""Who may write a run directory: the run lock of a flow run, and the shard leases of its shard tasks.

run_lock(run_dir, purpose, shared=False)   exclusive (default): the flow run holds RUN_DIR/.lock to its end,
                                           and a second run is refused (RunLockedError)
                                           shared (extract.share_run_dir): a guard held only until `opened()`
                                           (run.json written); other shared flow runs wait for it, then
                                           extract the same directory, shard by shard
shard_lease(config, shard, under=lock)     the lease a shard task holds while it extracts (eagle3.store.lease)

A flow holds them through its FlowContext (tasks/flow_context.py: `ctx.hold()`, `ctx.check_lock()`,
`ctx.shard_lease()`), which it passes to its shard tasks.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from prefect import get_run_logger
from prefect.runtime import flow_run

from eagle3.config import PipelineConfig
from eagle3.store.lease import ShardLease
from eagle3.store.lock import RunLock

OPEN_WAIT_S = 20 * 60  # a shared guard waits this long for another flow run's open-run (it hashes the model)


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
    is taken over). The lock heartbeats in its own thread; shard tasks check it (FlowContext.check_lock) before
    writing."""
    lock = RunLock(
        run_dir,
        purpose="open-run" if shared else purpose,
        flow_run_id=flow_run.get_id(),
        ttl_s=ttl_s,
        heartbeat_s=heartbeat_of(ttl_s),
        exclusive=not shared,
        wait_s=OPEN_WAIT_S if shared else 0.0,
    ).acquire()
    try:
        if lock.took_over is not None:
            get_run_logger().warning("%s: took over a stale lock (%s)", run_dir, lock.took_over.describe())
        yield RunHold(lock)
    finally:
        lock.release()


def shard_lease(config: PipelineConfig, shard: int, *, under: RunLock | None) -> ShardLease:
    """The (not yet taken) lease on `shard`, under the flow run's exclusive lock on the run directory if it holds
    one (`under`)."""
    ttl = config.extract.lease_ttl_s
    return ShardLease(
        config.run_dir,
        shard,
        flow_run_id=flow_run.get_id(),
        ttl_s=ttl,
        heartbeat_s=heartbeat_of(ttl),
        under=under,
    )
