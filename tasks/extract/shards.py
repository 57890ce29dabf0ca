"""extract: one task per shard around `eagle3.extract.shard.extract_shard`, and `run_shards`, which keeps every
server of the flow run busy with its own shards.

The pieces around it: tasks/extract/open_run.py (open the run, the disk budget), tasks/extract/claim.py (taking
a shard's lease, the states a shard task hands back), eagle3/extract/pool.py (the servers, lent to one shard
task at a time), tasks/hold.py (the run lock and the shard leases), tasks/progress.py (the run's progress board),
tasks/extract/report.py (tables, events, the flow's outcome), tasks/extract/plan.py (what the tasks pass each
other), and tasks/flow_context.py (the flow run's lock, servers and progress board, which the flow passes to these tasks
as `ctx`).

A shard task takes the shard's lease (eagle3.store.lease) before it looks for work, so no shard is extracted by two
processes at once, whichever flow runs or nodes share the run directory. A shard another live run holds is
handed back at once as `Leased`; `run_shards` then waits for those (`wait=True`), and takes over a lease whose
holder died.
"""

from __future__ import annotations

import hashlib
import time
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

from prefect import Task, get_run_logger, task
from prefect.cache_policies import INPUTS, RUN_ID, TASK_SOURCE, CachePolicy
from prefect.client.schemas.objects import TaskRun
from prefect.context import TaskRunContext
from prefect.futures import PrefectFuture
from prefect.states import State
from prefect.task_runners import ThreadPoolTaskRunner

from eagle3.config import PipelineConfig
from eagle3.extract.disk import GB, DiskBudgetError, DiskGuard, shard_budget
from eagle3.extract.pool import server_count
from eagle3.extract.shard import RunMismatchError, extract_shard, shard_is_complete
from eagle3.progress import Progress, ProgressFn
from eagle3.store.lease import ShardLease, ShardLeaseLostError
from eagle3.store.lock import RunLockedError, RunLockLostError
from eagle3.store.run_store import RunInfo, RunStore, ShardManifest
from tasks.artifacts import run_key
from tasks.extract.claim import is_leased, leased, result_of, settle, skipped, take_lease
from tasks.extract.plan import (
    ExtractPlan,
    ShardIncomplete,
    ShardResult,
    ShardStillLeased,
)
from tasks.extract.report import disk_low
from tasks.flow_context import FlowContext
from tasks.progress import RunProgressBoard, RunProgressRef, TaskProgress

SHARD_TIMEOUT_S = 6 * 3600  # one shard (2000 samples by default); raise data.shard_size with care
SHARD_RETRY_DELAY_S = 5
#: Failures a retry of the same task cannot fix: the disk, the lock or a lease lost, a store made for other data.
FINAL_ERRORS = (DiskBudgetError, RunLockLostError, ShardLeaseLostError, RunMismatchError, RunLockedError)


def retry_unless_final(task: Task[..., Any], task_run: TaskRun, state: State[Any]) -> bool:
    """retry_condition_fn: retry transient failures, never the disk budget, a lost lock or a wrong store."""
    return not isinstance(state.data, FINAL_ERRORS)


def store_identity(context: TaskRunContext, parameters: dict[str, Any]) -> str | None:
    """Cache-key part: the run.json this store has now. A deleted and rebuilt store gets a new run.json
    (new created_at), so a persisted shard result of the old store is never replayed for it."""
    config = parameters.get("config")
    if not isinstance(config, PipelineConfig):
        return None
    info = RunStore(config.run_dir).read_run_info()
    if info is None:
        return None
    identity = f"{Path(config.run_dir).resolve()}|{info.created_at}|{info.model_sha256}"
    return hashlib.sha256(identity.encode()).hexdigest()


#: Shard results persist (JSON, under PREFECT_HOME/storage) keyed by inputs, task source, flow run and store:
#: `prefect flow-run retry` of an extract flow run replays its completed shards and re-runs only the others. The
#: flow run's context (`ctx`, a live object: tasks/flow_context.py) and its progress reference are not inputs.
SHARD_CACHE: CachePolicy = (
    (INPUTS - "progress" - "ctx") + TASK_SOURCE + RUN_ID + CachePolicy.from_cache_key_fn(store_identity)
)


@task(
    name="extract-shard",
    task_run_name="extract-shard-{shard:05d}",
    retries=2,  # the flow sets extract.shard_retries
    retry_delay_seconds=SHARD_RETRY_DELAY_S,
    retry_condition_fn=retry_unless_final,
    timeout_seconds=SHARD_TIMEOUT_S,
    cache_policy=SHARD_CACHE,
    persist_result=True,
    result_serializer="json",  # no pickle
)
def extract_shard_task(
    config: PipelineConfig,
    model_dir: str,
    shard: int,
    ctx: FlowContext,
    progress: RunProgressRef | None = None,
    wait: bool = False,
) -> ShardResult | State:
    """Hidden states for every sample of one shard, on a free server of this flow run. A shard whose files are
    all present and sound is Skipped without touching a server; a shard with failed samples raises, and a retry
    redoes only those. A shard whose lease another live run holds is `Leased` (with `wait`: waited for, and
    Skipped when that run completes it, taken over when it dies). Not started when its missing samples would
    not fit on disk; stopped cleanly when the disk fills during it (both: event `eagle3.disk.low`, no retry).
    `ctx`: the flow run's context (tasks/flow_context.py): its run lock, its servers, its progress board."""
    logger = get_run_logger()
    store = RunStore(config.run_dir)
    info = store.read_run_info()
    if info is None:
        raise FileNotFoundError(f"{store.run_json} missing; the open-run task writes it before any shard")
    ctx.check_lock()
    board = ctx.board(progress, logger) if progress is not None else None
    report = ShardReport(logger, config.run_dir, shard, board)
    if shard_is_complete(store, shard, info):
        return skipped(store, shard, report, "skipped")
    lease = ctx.shard_lease(config, shard)
    if not take_lease(lease, wait, lambda: shard_is_complete(store, shard, info), SHARD_TIMEOUT_S):
        holder = lease.state()
        who = holder.describe() if holder is not None else "a run that has finished since"
        if shard_is_complete(store, shard, info):
            logger.info("shard %d: completed by another run (%s)", shard, who)
            return skipped(store, shard, report, "by-other-run", holder=who)
        if wait:
            raise ShardStillLeased(f"shard {shard}: still leased by {who} after {SHARD_TIMEOUT_S} s; run again later")
        logger.info("shard %d: leased by another run (%s); this flow run comes back to it at the end", shard, who)
        return leased(shard, who)
    with lease, report:
        if lease.took_over is not None:
            logger.warning("shard %d: took over a stale lease (%s)", shard, lease.took_over.describe())
        if shard_is_complete(store, shard, info):  # completed by another run between the two looks
            return skipped(store, shard, report, "by-other-run", holder="a run that finished it meanwhile")
        return extract_leased_shard(config, model_dir, ctx, store, info, shard, lease, report)


def extract_leased_shard(
    config: PipelineConfig,
    model_dir: str,
    ctx: FlowContext,
    store: RunStore,
    info: RunInfo,
    shard: int,
    lease: ShardLease,
    report: ProgressFn,
) -> ShardResult:
    logger = get_run_logger()
    start = time.monotonic()
    dump_dir, window = config.extract.dump_dir, config.extract.window
    try:
        shard_budget(store, info, shard, config.disk, dump_dir=dump_dir, in_flight=window)
        disk = DiskGuard(store, config.disk, scope=f"a write in shard {shard}", dump_dir=dump_dir)

        def guard(nbytes: int) -> None:
            ctx.check_lock()
            lease.check()
            disk(nbytes)

        with ctx.server_pool(config, model_dir).checkout() as (server, engine):
            logger.info("shard %d: on %s", shard, server.label)
            manifest = extract_shard(
                store, shard, engine, info, report, guard=guard, writer_threads=config.extract.writer_threads
            )
    except DiskBudgetError as e:
        disk_low(config.run_dir, e)
        raise
    seconds = time.monotonic() - start
    if manifest.status != "complete":
        raise ShardIncomplete(describe_errors(manifest))
    logger.info(
        "shard %d: %d samples, %d tokens, %.2f GB in %.1f s on %s",
        shard,
        len(manifest.samples),
        manifest.tokens,
        manifest.bytes / GB,
        seconds,
        server.label,
    )
    return result_of(manifest, shard, "complete", seconds, server=server.label)


class ShardReport:
    """The shard's own progress artifact (`<run>-extract-shard-NNNNN-progress`) and log lines, and its share of
    the flow run's progress. As a context manager around the extraction, it keeps the shard visibly alive while
    no sample finishes (a server starting, one long sample): TaskProgress's heartbeat."""

    def __init__(self, logger: Any, run_dir: str, shard: int, board: RunProgressBoard | None):
        self.shard = shard
        self.own = TaskProgress(logger, f"shard {shard}", key=run_key(run_dir, f"extract-shard-{shard:05d}-progress"))
        self.board = board

    def __call__(self, p: Progress) -> None:
        self.own(p)
        if self.board is not None:
            self.board.report(self.shard, p)

    def __enter__(self) -> ShardReport:
        self.own.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.own.__exit__(*exc)


def describe_errors(m: ShardManifest, show: int = 3) -> str:
    first = "; ".join(f"{sid}: {reason}" for sid, reason in list(m.errors.items())[:show])
    more = f" (+{len(m.errors) - show} more)" if len(m.errors) > show else ""
    return f"shard {m.shard} {m.status}: {len(m.errors)} of {m.expected} samples failed: {first}{more}"


def run_shards(config: PipelineConfig, model_dir: str, plan: ExtractPlan, ctx: FlowContext) -> dict[int, State[Any]]:
    """Every planned shard, as many at once as this flow run has servers: with several, through Prefect's
    thread-pool task runner (one thread per server); with one, in the flow's own thread, one after another (where
    Prefect can also interrupt a shard at its timeout). Shards another run holds come back `Leased` and are then
    waited for, so the flow run ends when each of its shards is complete, failed, or completed by the other run.
    `ctx`: the flow run's context, handed to every shard task. Returns shard -> final state."""
    shard_task: Task[..., Any] = extract_shard_task.with_options(retries=config.extract.shard_retries)
    waiting_task: Task[..., Any] = shard_task.with_options(timeout_seconds=2 * SHARD_TIMEOUT_S)  # wait, then work

    def parameters(shard: int, wait: bool) -> dict[str, Any]:
        return {"config": config, "model_dir": model_dir, "shard": shard, "ctx": ctx, "progress": plan.progress,
                "wait": wait}  # fmt: skip

    def run_all(runner: ThreadPoolTaskRunner[Any] | None, task: Task[..., Any], shards: list[int], wait: bool
                ) -> dict[int, State[Any]]:  # fmt: skip
        if runner is None:
            return {s: task(**parameters(s, wait), return_state=True) for s in shards}
        futures: dict[int, PrefectFuture[Any]] = {s: runner.submit(task, parameters(s, wait)) for s in shards}
        return {s: settle(f) for s, f in futures.items()}

    servers = server_count(config)
    pool: AbstractContextManager[ThreadPoolTaskRunner[Any] | None] = (
        ThreadPoolTaskRunner(max_workers=servers) if servers > 1 else nullcontext()
    )
    with pool as runner:
        states = run_all(runner, shard_task, plan.shards, wait=False)
        leased = [s for s, state in states.items() if is_leased(state)]
        states.update(run_all(runner, waiting_task, leased, wait=True))
    return states
