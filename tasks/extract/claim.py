"""How a shard task claims its shard and what it hands back as a Prefect state, so that several flow runs (on
one node or several) share a run directory: the lease is taken (or waited for), a shard that is complete is
`Skipped`, and a shard another live run holds comes back as a Completed state named `Leased`, which
`run_shards` (tasks/extract/shards.py) then waits for.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prefect import get_run_logger
from prefect.futures import PrefectFuture
from prefect.states import Completed, State

from eagle3.progress import Progress, ProgressFn
from eagle3.store.lease import ShardLease
from eagle3.store.run_store import RunStore, ShardManifest
from tasks.extract.plan import ShardOutcome, ShardResult

LEASE_POLL_S = 2.0  # how often a waiting shard task looks at a lease another run holds
LEASED = "Leased"


def take_lease(lease: ShardLease, wait: bool, give_up: Callable[[], bool], timeout_s: float) -> bool:
    """Take the lease now, or (`wait`) as soon as its holder gives it back or dies; False when given up."""
    if not wait:
        return lease.try_acquire()
    return lease.wait_acquire(timeout_s, poll_s=LEASE_POLL_S, give_up=give_up)


def leased(shard: int, holder: str) -> State:
    """The state of a shard another live run holds: not a failure, and not done."""
    return Completed(name=LEASED, data=result_of(None, shard, "leased", 0.0, holder=holder))


def is_leased(state: State[Any]) -> bool:
    return state.is_completed() and state.name == LEASED


def skipped(store: RunStore, shard: int, report: ProgressFn, status: ShardOutcome, holder: str = "") -> State:
    m = store.read_manifest(shard)
    assert m is not None  # shard_is_complete read it
    report(Progress("extract", m.expected, m.expected, 0, 0.0, skipped=m.expected))
    get_run_logger().info("shard %d: complete (%d samples), skipped", shard, m.expected)
    return Completed(name="Skipped", data=result_of(m, shard, status, 0.0, holder=holder))


def result_of(
    m: ShardManifest | None, shard: int, status: ShardOutcome, seconds: float, *, server: str = "", holder: str = ""
) -> ShardResult:
    return ShardResult(
        shard=shard,
        status=status,
        samples=len(m.samples) if m else 0,
        tokens=m.tokens if m else 0,
        bytes=m.bytes if m else 0,
        seconds=seconds,
        server=server,
        holder=holder,
    )


def settle(future: PrefectFuture[Any]) -> State[Any]:
    future.wait()
    return future.state
