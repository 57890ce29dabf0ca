"""What the tasks of one flow run share in this process: its hold on the run directory, its servers, its progress
board. The flow opens it and passes it to the tasks that use it; no task looks anything up in a module registry.

    with flow_context() as ctx:                                   # the servers close when the block ends
        with ctx.hold(config.run_dir, "extract", shared=False):   # the run lock, to the block's end
            plan = open_run_task(config, model_dir, ctx=ctx)      # ctx.servers: the flow's server pool
            run_shards(config, model_dir, plan, ctx)              # ctx.check_lock(), ctx.shard_lease(), ctx.board()

Why a task parameter (`ctx`), not an id into a process-wide registry:
- Prefect sends no task parameters to its API (a task run records only which upstream results it used), so the
  UI shows nothing of the object, and nothing tries to serialise it. The one cached task (extract-shard) leaves
  `ctx` out of its cache key (`INPUTS - "ctx"`): the key stays the hash of its data.
- Prefect looks for futures inside task parameters only in collections, dataclasses and pydantic models; a
  FlowContext is a plain object, so it reaches the task as it is, in the flow's thread or in a thread of the
  flow's ThreadPoolTaskRunner (several servers: one shard task per server at once).
- A task's retries run in the same flow run, in this process, with the same object. `prefect flow-run retry`
  runs the flow function again, which opens a new context (persisted shard results replay as before).

Subflows: a flow's parameters do go to the API (the UI shows them; a deployment needs them as JSON), so a flow
cannot hand its context to a subflow as a parameter. The pipeline opens the servers for synthesize and its
extract subflow, so each SGLang server launches once for both: a `flow_context()` opened while another one is
open in the same thread (the subflow runs inline in its parent's thread) shares the parent's servers; its hold and
progress board are its own. A context variable carries that, set only for the duration of the parent's `with`
block. Flow runs in other processes (a deployment's run in a worker's subprocess, the fan-out's children) have no
parent here and open their own. Servers close when the outermost block ends, or earlier when a `hold()` block
ends (before its lock goes: the servers write into the run directory).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from eagle3.config import PipelineConfig
from eagle3.extract.pool import ServerPool, ServerPools
from eagle3.store.lease import ShardLease
from eagle3.store.lock import RunLock
from tasks.hold import RunHold, run_lock, shard_lease
from tasks.progress import RunProgressBoard, RunProgressRef
from tasks.server import server_env

_OPEN: ContextVar[FlowContext | None] = ContextVar("eagle3_flow_context", default=None)


class FlowContext:
    """One flow run's shared state in this process: `servers` (its server pools, possibly its parent flow's), the
    exclusive run lock while `hold()` is open, and the run-level progress board its shard tasks feed."""

    def __init__(self, servers: ServerPools):
        self.servers = servers
        self._lock: RunLock | None = None
        self._boards: dict[str, RunProgressBoard] = {}
        self._boards_lock = threading.Lock()

    def server_pool(self, config: PipelineConfig, model_dir: str) -> ServerPool:
        """The servers of `config` for this flow run (built on first use; launched on first extraction)."""
        return self.servers.pool(config, Path(model_dir))

    @contextmanager
    def hold(self, run_dir: str, purpose: str, *, shared: bool = False, ttl_s: float = 600.0) -> Iterator[RunHold]:
        """Hold `run_dir` for this flow run (tasks/hold.py `run_lock`); while an exclusive hold is open,
        `check_lock()` checks it and shard leases are taken under it. When the block ends the servers close before
        the lock goes (they write into the run directory, and the next run launches its own on the same ports),
        a parent flow's servers too: a subflow that holds the run directory is the last to use them."""
        with run_lock(run_dir, purpose, shared=shared, ttl_s=ttl_s) as hold:
            self._lock = None if shared else hold.lock
            try:
                yield hold
            finally:
                self._lock = None
                self.servers.close()

    def check_lock(self) -> None:
        """RunLockLostError when this flow run's exclusive lock was taken over (no-op without one)."""
        if self._lock is not None:
            self._lock.check()

    def shard_lease(self, config: PipelineConfig, shard: int) -> ShardLease:
        """The (not yet taken) lease on `shard`, under this flow run's exclusive lock if it holds one."""
        return shard_lease(config, shard, under=self._lock)

    def board(self, ref: RunProgressRef, logger: Any) -> RunProgressBoard:
        """The progress board of `ref`'s artifact, one per flow run, fed by all its shard tasks at once."""
        with self._boards_lock:
            if ref.artifact_id not in self._boards:
                self._boards[ref.artifact_id] = RunProgressBoard(ref, logger)
            return self._boards[ref.artifact_id]


@contextmanager
def flow_context() -> Iterator[FlowContext]:
    """A flow run's context for the `with` block: new servers (closed at its end: launched SGLang servers stop),
    or, inside another flow's block in this thread (a subflow), that flow's servers (closed at the end of that
    flow's block, or of a `hold()` on the run directory)."""
    parent = _OPEN.get()
    servers = parent.servers if parent is not None else ServerPools(server_env())
    ctx = FlowContext(servers)
    token = _OPEN.set(ctx)
    try:
        yield ctx
    finally:
        _OPEN.reset(token)
        if parent is None:
            servers.close()
