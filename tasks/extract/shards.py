"""extract: open the run, the disk budget, one task per shard around `eagle3.extract.extract_shard`, and
`run_shards`, which keeps every server of the flow run busy with its own shards.

The pieces around it: eagle3/server_pool.py (the servers, lent to one shard task at a time),
tasks/extract/hold.py (the run lock and the shard leases), tasks/extract/report.py (progress, tables, events,
the flow's outcome), tasks/extract/plan.py (what the tasks pass each other), and tasks/flow_context.py (the flow
run's lock, servers and progress board, which the flow passes to these tasks as `ctx`).

A shard task takes the shard's lease (eagle3.lease) before it looks for work, so no shard is extracted by two
processes at once, whichever flow runs or nodes share the run directory. A shard another live run holds is
handed back at once as `Leased`; `run_shards` then waits for those (`wait=True`), and takes over a lease whose
holder died.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

from prefect import Task, get_run_logger, task
from prefect.cache_policies import INPUTS, NO_CACHE, RUN_ID, TASK_SOURCE, CachePolicy
from prefect.client.schemas.objects import TaskRun
from prefect.context import TaskRunContext
from prefect.futures import PrefectFuture
from prefect.states import Completed, State
from prefect.task_runners import ThreadPoolTaskRunner

from eagle3.config import PipelineConfig
from eagle3.disk import DiskBudgetError, DiskGuard, fmt_bytes, run_budget, shard_budget
from eagle3.extract import RunMismatchError, extract_shard, open_run, shard_is_complete
from eagle3.lease import ShardLease, ShardLeaseLostError
from eagle3.lock import RunLockedError, RunLockLostError
from eagle3.progress import Progress, ProgressFn
from eagle3.server_pool import server_count
from eagle3.store import RunInfo, RunStore, ShardManifest
from tasks.artifacts import RunProgressRef, TaskProgress, create_run_progress, run_key
from tasks.extract.plan import (
    ExtractPlan,
    ShardIncomplete,
    ShardOutcome,
    ShardResult,
    ShardStillLeased,
    select_shards,
)
from tasks.extract.report import RunProgressBoard, disk_low
from tasks.flow_context import FlowContext
from tasks.server import reap_orphan_servers

OPEN_RUN_TIMEOUT_S = 15 * 60  # hashes the model directory (weights > 64 MiB: first and last MiB only)
SHARD_TIMEOUT_S = 6 * 3600  # one shard (2000 samples by default); raise data.shard_size with care
SHARD_RETRY_DELAY_S = 5
BUDGET_TIMEOUT_S = 10 * 60  # reads every shard manifest; with disk.budget_gb also walks the store
LEASE_POLL_S = 2.0  # how often a waiting shard task looks at a lease another run holds
GB = 1e9
LEASED = "Leased"
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


@task(name="open-run", retries=0, timeout_seconds=OPEN_RUN_TIMEOUT_S, cache_policy=NO_CACHE)
def open_run_task(
    config: PipelineConfig, model_dir: str, ctx: FlowContext, shards: list[int] | None = None
) -> ExtractPlan:
    """Write run.json (or check that the existing store is for the same model, layers and data) and
    start the run-level progress artifact. `shards` (a retry's plan) replaces extract.shards. `ctx`: the flow
    run's context, whose server pool says what the engine captures (building it launches nothing)."""
    logger = get_run_logger()
    store = RunStore(config.run_dir)
    reap_orphan_servers(config.run_dir)  # before this run's servers launch on the same ports
    pool = ctx.server_pool(config, model_dir)
    info = open_run(config, store, Path(model_dir), pool.info)
    prepared = store.read_prepared_manifest()
    assert prepared is not None  # open_run refuses a store without prepared data
    shards = select_shards(config.extract.shards if shards is None else shards, len(prepared.shards))
    expected = {s: prepared.shards[s] for s in shards}
    logger.info(
        "run %s: model %s, engine %s %s, HF aux layers %s (engine ids %s), %d shards, %d samples; servers: %s",
        store.root,
        info.model_path,
        info.engine,
        info.engine_version,
        info.aux_layers,
        info.engine_layer_ids,
        len(shards),
        sum(expected.values()),
        ", ".join(s.label for s in pool.specs),
    )
    progress = create_run_progress(config.run_dir, "extract", sum(expected.values()))
    return ExtractPlan(run_dir=config.run_dir, shards=shards, expected=expected, progress=progress)


@task(name="disk-budget", retries=0, timeout_seconds=BUDGET_TIMEOUT_S, cache_policy=NO_CACHE)
def disk_budget_task(config: PipelineConfig, plan: ExtractPlan) -> dict[str, int]:
    """Before any shard: will the samples still missing in `plan.shards` fit (store, and the dump directory
    when it is another filesystem)? DiskBudgetError (event `eagle3.disk.low`, never retried) when not."""
    store = RunStore(config.run_dir)
    info = store.read_run_info()
    if info is None:
        raise FileNotFoundError(f"{store.run_json} missing; the open-run task writes it before the budget check")
    try:
        checks = run_budget(
            store, info, plan.shards, config.disk, dump_dir=config.extract.dump_dir, in_flight=config.extract.window
        )
    except DiskBudgetError as e:
        disk_low(config.run_dir, e)
        raise
    for c in checks:
        get_run_logger().info(
            "disk budget (%s): need %s, %s may be used (%s free)",
            c.where,
            fmt_bytes(c.need_bytes),
            fmt_bytes(c.available_bytes),
            fmt_bytes(c.free_bytes),
        )
    return {c.where: c.need_bytes for c in checks}


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
    if not take_lease(lease, wait, give_up=lambda: shard_is_complete(store, shard, info)):
        holder = lease.state()
        who = holder.describe() if holder is not None else "a run that has finished since"
        if shard_is_complete(store, shard, info):
            logger.info("shard %d: completed by another run (%s)", shard, who)
            return skipped(store, shard, report, "by-other-run", holder=who)
        if wait:
            raise ShardStillLeased(f"shard {shard}: still leased by {who} after {SHARD_TIMEOUT_S} s; run again later")
        logger.info("shard %d: leased by another run (%s); this flow run comes back to it at the end", shard, who)
        return Completed(name=LEASED, data=result_of(None, shard, "leased", 0.0, holder=who))
    with lease, report:
        if lease.took_over is not None:
            logger.warning("shard %d: took over a stale lease (%s)", shard, lease.took_over.describe())
        if shard_is_complete(store, shard, info):  # completed by another run between the two looks
            return skipped(store, shard, report, "by-other-run", holder="a run that finished it meanwhile")
        return extract_leased_shard(config, model_dir, ctx, store, info, shard, lease, report)


def take_lease(lease: ShardLease, wait: bool, give_up: Callable[[], bool]) -> bool:
    """Take the lease now, or (`wait`) as soon as its holder gives it back or dies; False when given up."""
    if not wait:
        return lease.try_acquire()
    return lease.wait_acquire(SHARD_TIMEOUT_S, poll_s=LEASE_POLL_S, give_up=give_up)


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


def describe_errors(m: ShardManifest, show: int = 3) -> str:
    first = "; ".join(f"{sid}: {reason}" for sid, reason in list(m.errors.items())[:show])
    more = f" (+{len(m.errors) - show} more)" if len(m.errors) > show else ""
    return f"shard {m.shard} {m.status}: {len(m.errors)} of {m.expected} samples failed: {first}{more}"


def is_leased(state: State[Any]) -> bool:
    return state.is_completed() and state.name == LEASED


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


def settle(future: PrefectFuture[Any]) -> State[Any]:
    future.wait()
    return future.state
