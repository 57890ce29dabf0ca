"""extract: open the run, the disk budget, one task per shard around `eagle3.extract.extract_shard`, the report.

The engine is built once per process and shared by the shard tasks that run there (building is cheap:
the transformers engine loads weights on its first forward, so a run whose shards are all complete
never loads the model). `engine_session()` closes it when the flow is done with it; `run_lock()` holds
the run directory (eagle3.lock.RunLock) for the flow, and the shard tasks check it before each write.

Events (resource `eagle3.run.<run directory name>`):
    eagle3.disk.low      a disk check failed (payload: DiskCheck.as_event_payload(): need, free, total, reserve, ...)
    eagle3.shard.failed  a shard ended failed or partial (shard, status, failed samples, first error, log)
    eagle3.run.completed every selected shard is complete (samples, tokens, bytes, shards)
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from prefect import Task, get_run_logger, task
from prefect.cache_policies import INPUTS, NO_CACHE, RUN_ID, TASK_SOURCE, CachePolicy
from prefect.client.schemas.objects import TaskRun
from prefect.context import TaskRunContext
from prefect.events import emit_event
from prefect.runtime import flow_run
from prefect.states import Completed, Failed, State
from pydantic import BaseModel

from eagle3.config import PipelineConfig
from eagle3.disk import DiskBudgetError, DiskGuard, fmt_bytes, run_budget, shard_budget
from eagle3.engines import Engine, build_engine
from eagle3.extract import RunMismatchError, extract_shard, open_run, shard_is_complete
from eagle3.lock import RunLock, RunLockLostError
from eagle3.progress import Progress
from eagle3.retry import failed_shards
from eagle3.store import RunInfo, RunStore, ShardManifest
from tasks.artifacts import (
    RunProgressRef,
    TaskProgress,
    create_run_progress,
    finish_run_progress,
    markdown_artifact,
    run_key,
    table_artifact,
)

OPEN_RUN_TIMEOUT_S = 15 * 60  # hashes the model directory (weights > 64 MiB: first and last MiB only)
SHARD_TIMEOUT_S = 6 * 3600  # one shard (2000 samples by default); raise data.shard_size with care
SHARD_RETRY_DELAY_S = 5
REPORT_TIMEOUT_S = 10 * 60
BUDGET_TIMEOUT_S = 10 * 60  # reads every shard manifest; with disk.budget_gb also walks the store
GB = 1e9
#: Failures a retry of the same task cannot fix: the disk, the lock, a store made for other data.
FINAL_ERRORS = (DiskBudgetError, RunLockLostError, RunMismatchError)

_ENGINES: dict[str, Engine] = {}
_LOCKS: dict[str, RunLock] = {}  # resolved run_dir -> the lock this process's flow holds


def retry_hint(run_dir: str) -> str:
    return (
        f"Fix the cause (the first error says it), then `eagle3 retry {run_dir}` (only failed and partial shards, "
        "only their missing samples) or run extraction again (`eagle3 run CONFIG --stages extract`): complete "
        "shards are skipped and only the missing samples are redone."
    )


def engine_for(config: PipelineConfig, model_dir: str) -> Engine:
    """The engine for this model and server config, built once per process."""
    key = json.dumps([str(Path(model_dir).resolve()), config.server.model_dump(mode="json"), config.extract.aux_layers])
    if key not in _ENGINES:
        _ENGINES[key] = build_engine(config, Path(model_dir))
    return _ENGINES[key]


def close_engines() -> None:
    """Close every engine of this process (a launched SGLang server stops; cached weights stay)."""
    while _ENGINES:
        _, engine = _ENGINES.popitem()
        engine.close()


@contextmanager
def engine_session() -> Iterator[None]:
    try:
        yield
    finally:
        close_engines()


@contextmanager
def run_lock(run_dir: str, purpose: str) -> Iterator[RunLock]:
    """Hold `run_dir` for this flow run (RunLockedError when another live run holds it; a stale lock is
    taken over). The lock heartbeats in its own thread; the shard tasks call `check()` before writing."""
    lock = RunLock(run_dir, purpose=purpose, flow_run_id=flow_run.get_id()).acquire()
    key = str(Path(run_dir).resolve())
    _LOCKS[key] = lock
    try:
        if lock.took_over is not None:
            get_run_logger().warning("%s: took over a stale lock (%s)", run_dir, lock.took_over.describe())
        yield lock
    finally:
        _LOCKS.pop(key, None)
        lock.release()


def check_lock(run_dir: str) -> None:
    """Raise RunLockLostError when this process's lock on `run_dir` was taken over (no-op without one)."""
    lock = _LOCKS.get(str(Path(run_dir).resolve()))
    if lock is not None:
        lock.check()


def emit_run_event(run_dir: str, event: str, payload: dict[str, Any]) -> None:
    """A Prefect event about the run directory: resource `eagle3.run.<name>` (related: the current run)."""
    name = Path(run_dir).resolve().name or "run"
    resource = {
        "prefect.resource.id": f"eagle3.run.{name}",
        "prefect.resource.name": name,
        "eagle3.run_dir": str(Path(run_dir).resolve()),
    }
    emit_event(event=event, resource=resource, payload=payload)


def disk_low(run_dir: str, e: DiskBudgetError) -> None:
    """Emit `eagle3.disk.low` (the task then fails with the error's message: need, free, what to do)."""
    emit_run_event(run_dir, "eagle3.disk.low", e.check.as_event_payload())


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
#: `prefect flow-run retry` of an extract flow run replays its completed shards and re-runs only the others.
SHARD_CACHE: CachePolicy = (INPUTS - "progress") + TASK_SOURCE + RUN_ID + CachePolicy.from_cache_key_fn(store_identity)


class ExtractPlan(BaseModel):
    """What the shard tasks need to know about this flow run: small and serialisable."""

    run_dir: str
    shards: list[int]
    expected: dict[int, int]  # shard -> prepared samples
    progress: RunProgressRef

    def progress_for(self, shard: int) -> RunProgressRef:
        """The run progress as seen by `shard`: the shards before it (in plan order) are done."""
        before = sum(self.expected[s] for s in self.shards[: self.shards.index(shard)])
        return self.progress.model_copy(update={"done_before": before})


class ShardResult(BaseModel):
    shard: int
    status: Literal["complete", "skipped"]
    samples: int
    tokens: int
    bytes: int
    seconds: float


class ShardIncomplete(RuntimeError):
    """Some samples of a shard failed; retrying the task redoes only those."""


class ExtractIncomplete(RuntimeError):
    """Some shards did not complete; raised in the caller of the extract flow (e.g. the pipeline)."""


class ExtractSummary(BaseModel):
    run_dir: str
    shards: list[int]
    complete: list[int]
    failed: dict[int, str]  # shard -> reason
    samples: int
    expected: int
    tokens: int
    bytes: int


def select_shards(wanted: list[int] | None, num_shards: int) -> list[int]:
    if wanted is None:
        return list(range(num_shards))
    missing = [s for s in wanted if not 0 <= s < num_shards]
    if missing:
        raise ValueError(f"extract.shards {wanted}: {missing} do not exist; the run has shards 0..{num_shards - 1}")
    return sorted(set(wanted))


@task(name="open-run", retries=0, timeout_seconds=OPEN_RUN_TIMEOUT_S, cache_policy=NO_CACHE)
def open_run_task(config: PipelineConfig, model_dir: str, shards: list[int] | None = None) -> ExtractPlan:
    """Write run.json (or check that the existing store is for the same model, layers and data) and
    start the run-level progress artifact. `shards` (a retry's plan) replaces extract.shards."""
    logger = get_run_logger()
    store = RunStore(config.run_dir)
    info = open_run(config, store, Path(model_dir), engine_for(config, model_dir).info)
    prepared = store.read_prepared_manifest()
    assert prepared is not None  # open_run refuses a store without prepared data
    shards = select_shards(config.extract.shards if shards is None else shards, len(prepared.shards))
    expected = {s: prepared.shards[s] for s in shards}
    logger.info(
        "run %s: model %s, engine %s %s, HF aux layers %s (engine ids %s), %d shards, %d samples",
        store.root,
        info.model_path,
        info.engine,
        info.engine_version,
        info.aux_layers,
        info.engine_layer_ids,
        len(shards),
        sum(expected.values()),
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
    config: PipelineConfig, model_dir: str, shard: int, progress: RunProgressRef | None = None
) -> ShardResult | State:
    """Hidden states for every sample of one shard. A shard whose files are all present and sound is
    Skipped without touching the engine; a shard with failed samples raises, and a retry redoes only those.
    Not started when its missing samples would not fit on disk; stopped cleanly when the disk fills during
    it (both: event `eagle3.disk.low`, no retry)."""
    logger = get_run_logger()
    store = RunStore(config.run_dir)
    info = store.read_run_info()
    if info is None:
        raise FileNotFoundError(f"{store.run_json} missing; the open-run task writes it before any shard")
    check_lock(config.run_dir)
    report = TaskProgress(logger, f"shard {shard}", run=progress)
    if shard_is_complete(store, shard, info):
        m = store.read_manifest(shard)
        assert m is not None
        report(Progress("extract", m.expected, m.expected, 0, 0.0, skipped=m.expected))
        logger.info("shard %d: complete (%d samples), skipped", shard, m.expected)
        return Completed(name="Skipped", data=result_of(m, "skipped", 0.0))
    start = time.monotonic()
    dump_dir, window = config.extract.dump_dir, config.extract.window
    try:
        shard_budget(store, info, shard, config.disk, dump_dir=dump_dir, in_flight=window)
        disk = DiskGuard(store, config.disk, scope=f"a write in shard {shard}", dump_dir=dump_dir)

        def guard(nbytes: int) -> None:
            check_lock(config.run_dir)
            disk(nbytes)

        manifest = extract_shard(store, shard, engine_for(config, model_dir), info, report, guard=guard)
    except DiskBudgetError as e:
        disk_low(config.run_dir, e)
        raise
    seconds = time.monotonic() - start
    if manifest.status != "complete":
        raise ShardIncomplete(describe_errors(manifest))
    logger.info(
        "shard %d: %d samples, %d tokens, %.2f GB in %.1f s",
        shard,
        len(manifest.samples),
        manifest.tokens,
        manifest.bytes / GB,
        seconds,
    )
    return result_of(manifest, "complete", seconds)


def result_of(m: ShardManifest, status: Literal["complete", "skipped"], seconds: float) -> ShardResult:
    return ShardResult(
        shard=m.shard, status=status, samples=len(m.samples), tokens=m.tokens, bytes=m.bytes, seconds=seconds
    )


def describe_errors(m: ShardManifest, show: int = 3) -> str:
    first = "; ".join(f"{sid}: {reason}" for sid, reason in list(m.errors.items())[:show])
    more = f" (+{len(m.errors) - show} more)" if len(m.errors) > show else ""
    return f"shard {m.shard} {m.status}: {len(m.errors)} of {m.expected} samples failed: {first}{more}"


def failure_messages(states: Mapping[int, State[Any]]) -> dict[int, str]:
    """shard -> message, for the shard tasks that did not complete."""
    return {s: state.message or state.name or "failed" for s, state in states.items() if not state.is_completed()}


@task(name="report-extract", retries=1, retry_delay_seconds=2, timeout_seconds=REPORT_TIMEOUT_S, cache_policy=NO_CACHE)
def report_extract_task(config: PipelineConfig, plan: ExtractPlan, failures: dict[int, str]) -> ExtractSummary:
    """The shard table and the markdown summary (keyed per run directory); closes the run progress."""
    store = RunStore(config.run_dir)
    info = store.read_run_info()
    manifests = {s: store.read_manifest(s) for s in plan.shards}
    rows = [shard_row(s, plan.expected[s], manifests[s], failures.get(s)) for s in plan.shards]
    failed = {r["shard"]: r["error"] or r["status"] for r in rows if not_complete(r, failures)}
    summary = ExtractSummary(
        run_dir=str(store.root.resolve()),
        shards=plan.shards,
        complete=[r["shard"] for r in rows if r["shard"] not in failed],
        failed=failed,
        samples=sum(r["samples"] for r in rows),
        expected=sum(plan.expected.values()),
        tokens=sum(r["tokens"] for r in rows),
        bytes=sum(int(r["GB"] * GB) for r in rows),
    )
    table_artifact(
        run_key(config.run_dir, "extract-shards"), rows, f"Shards of {summary.run_dir}: {len(failed)} not complete"
    )
    failed_rows = [{**r, "log": log_of(store, manifests[r["shard"]])} for r in rows if r["shard"] in failed]
    for r in failed_rows:
        emit_run_event(config.run_dir, "eagle3.shard.failed", shard_event(r))
    failed_rows += earlier_failures(store, plan.shards)
    table_artifact(  # written every run and over the whole store, so the latest version is always current
        run_key(config.run_dir, "extract-failed-shards"),
        failed_rows,
        f"{len(failed_rows)} shards not complete. {retry_hint(config.run_dir)}" if failed_rows else "No failed shards.",
    )
    if not failed_rows:
        emit_run_event(config.run_dir, "eagle3.run.completed", completed_event(summary))
    markdown_artifact(run_key(config.run_dir, "extract-summary"), summary_markdown(summary, info), "Extraction summary")
    finish_run_progress(
        plan.progress,
        summary.samples,
        f"{summary.samples}/{summary.expected} samples in store, {len(summary.complete)}/{len(plan.shards)} "
        f"shards complete" + (f", failed: {sorted(failed)}" if failed else ""),
    )
    get_run_logger().info(
        "extraction: %d/%d samples, %d tokens, %.2f GB; %d/%d shards complete%s",
        summary.samples,
        summary.expected,
        summary.tokens,
        summary.bytes / GB,
        len(summary.complete),
        len(plan.shards),
        f"; not complete: {sorted(failed)}" if failed else "",
    )
    return summary


def shard_event(row: dict[str, Any]) -> dict[str, Any]:
    """Payload of `eagle3.shard.failed` from a failed-shards table row."""
    return {
        "shard": row["shard"],
        "status": row["status"],
        "failed_samples": row["errors"],
        "first_error": row["error"],
        "log": row["log"],
    }


def completed_event(s: ExtractSummary) -> dict[str, Any]:
    """Payload of `eagle3.run.completed`."""
    return {"shards": s.shards, "samples": s.samples, "expected": s.expected, "tokens": s.tokens, "bytes": s.bytes}


def earlier_failures(store: RunStore, planned: list[int]) -> list[dict[str, Any]]:
    """Failed-shards rows of shards outside this flow run's plan whose manifest says failed or partial."""
    out = []
    for s in failed_shards(store):
        if s.shard not in planned:
            m = store.read_manifest(s.shard)
            out.append({**shard_row(s.shard, s.expected, m, None), "log": log_of(store, m)})
    return out


def not_complete(row: dict[str, Any], failures: dict[int, str]) -> bool:
    return row["status"] != "complete" or row["shard"] in failures


def log_of(store: RunStore, m: ShardManifest | None) -> str:
    if m is None:
        return "no manifest: the task failed before the shard started (see the task run's logs)"
    return m.log or str(store.manifest_path(m.shard))


def shard_row(shard: int, expected: int, m: ShardManifest | None, failure: str | None) -> dict[str, Any]:
    errors = dict(m.errors) if m else {}
    first_error = next(iter(errors.items()), None)
    error = failure or (f"{first_error[0]}: {first_error[1]}" if first_error else "")
    return {
        "shard": shard,
        "status": (m.status if m else "failed" if failure else "pending"),
        "samples": len(m.samples) if m else 0,
        "expected": expected,
        "tokens": m.tokens if m else 0,
        "GB": round(m.bytes / GB, 4) if m else 0.0,
        "errors": len(errors) or int(failure is not None),
        "error": error[:300],
    }


def summary_markdown(s: ExtractSummary, info: RunInfo | None) -> str:
    lines = [
        f"# Extraction: `{s.run_dir}`",
        "",
        f"- samples: **{s.samples} / {s.expected}**, tokens: {s.tokens}, size: {s.bytes / GB:.3f} GB",
        f"- shards complete: {len(s.complete)} / {len(s.shards)}",
    ]
    if s.failed:
        lines.append(f"- **not complete: {', '.join(str(x) for x in sorted(s.failed))}** (see the shard table)")
    if info is not None:
        lines += [
            f"- model: `{info.model_path}` (sha256 {info.model_sha256[:12]}), {info.num_layers} layers, "
            f"hidden {info.hidden_size}, {info.dtype}",
            f"- engine: {info.engine} {info.engine_version}",
            f"- aux layers (HF hidden_states indices): {info.aux_layers}; engine ids {info.engine_layer_ids} "
            f"({info.engine_layer_convention})",
            f"- dataset fingerprint: {info.dataset_fingerprint[:12]}",
        ]
    lines += ["", f"Inspect: `eagle3 status {s.run_dir}`"]
    return "\n".join(lines)


def extract_outcome(summary: ExtractSummary) -> ExtractSummary | State:
    """The flow's result: the summary, or a Failed state naming the shards that did not complete."""
    if not summary.failed:
        return summary
    names = "; ".join(f"shard {k}: {v}" for k, v in sorted(summary.failed.items()))
    message = (
        f"{len(summary.failed)} of {len(summary.shards)} shards did not complete ({names}). "
        f"{retry_hint(summary.run_dir)}"
    )
    return Failed(message=message, data=ExtractIncomplete(message))
