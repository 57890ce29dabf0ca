"""What an extract flow run tells the world: the shard table, the failed-shards table, the markdown summary, events
(tasks/events.py), and the flow's final state. Its run progress over shards running at once is tasks/progress.py's
`RunProgressBoard`.

Events (resource `eagle3.run.<run directory name>`):
    eagle3.disk.low      a disk check failed (payload: DiskCheck.as_event_payload(): need, free, total, reserve, ...)
    eagle3.shard.failed  a shard ended failed or partial (shard, status, failed samples, first error, log)
    eagle3.run.completed every selected shard is complete (samples, tokens, bytes, shards)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.states import Failed, State

from eagle3.config import PipelineConfig
from eagle3.extract.disk import GB, DiskBudgetError
from eagle3.store.failed_shards import failed_shards
from eagle3.store.run_store import RunInfo, RunStore, ShardManifest
from tasks.artifacts import markdown_artifact, run_key, table_artifact
from tasks.events import emit_run_event
from tasks.extract.plan import ExtractIncomplete, ExtractPlan, ExtractSummary, ShardResult
from tasks.progress import finish_run_progress

REPORT_TIMEOUT_S = 10 * 60


def retry_hint(run_dir: str) -> str:
    return (
        f"Fix the cause (the first error says it), then `eagle3 retry {run_dir}` (only failed and partial shards, "
        "only their missing samples) or run extraction again (`eagle3 run CONFIG --stages extract`): complete "
        "shards are skipped and only the missing samples are redone."
    )


# events ----------------------------------------------------------------------------------------------------
def disk_low(run_dir: str, e: DiskBudgetError) -> None:
    """Emit `eagle3.disk.low` (the task then fails with the error's message: need, free, what to do)."""
    emit_run_event(run_dir, "eagle3.disk.low", e.check.as_event_payload())


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


# the report task -------------------------------------------------------------------------------------------
def outcomes(states: Mapping[int, State[Any]]) -> tuple[dict[int, ShardResult], dict[int, str]]:
    """(shard -> result of the shard tasks that completed, shard -> message of those that did not)."""
    results: dict[int, ShardResult] = {}
    failures: dict[int, str] = {}
    for s, state in states.items():
        if state.is_completed():
            result = state.result(raise_on_failure=False)
            if isinstance(result, ShardResult):
                results[s] = result
        else:
            failures[s] = state.message or state.name or "failed"
    return results, failures


@task(name="report-extract", retries=1, retry_delay_seconds=2, timeout_seconds=REPORT_TIMEOUT_S, cache_policy=NO_CACHE)
def report_extract_task(
    config: PipelineConfig,
    plan: ExtractPlan,
    failures: dict[int, str],
    results: dict[int, ShardResult] | None = None,
) -> ExtractSummary:
    """The shard table and the markdown summary (keyed per run directory); closes the run progress."""
    results = results or {}
    store = RunStore(config.run_dir)
    info = store.read_run_info()
    manifests = {s: store.read_manifest(s) for s in plan.shards}
    rows = [shard_row(s, plan.expected[s], manifests[s], failures.get(s), results.get(s)) for s in plan.shards]
    failed = {r["shard"]: r["error"] or r["status"] for r in rows if not_complete(r, failures)}
    servers: dict[str, list[int]] = {}
    for result in results.values():
        if result.status == "complete":
            servers.setdefault(result.server, []).append(result.shard)
    summary = ExtractSummary(
        run_dir=str(store.root.resolve()),
        shards=plan.shards,
        complete=[r["shard"] for r in rows if r["shard"] not in failed],
        failed=failed,
        samples=sum(r["samples"] for r in rows),
        expected=sum(plan.expected.values()),
        tokens=sum(r["tokens"] for r in rows),
        bytes=sum(int(r["GB"] * GB) for r in rows),
        extracted=sorted(s for s, r in results.items() if r.status == "complete"),
        by_other_runs=sorted(s for s, r in results.items() if r.status == "by-other-run"),
        servers={k: sorted(v) for k, v in sorted(servers.items())},
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
        "extraction: %d/%d samples, %d tokens, %.2f GB; %d/%d shards complete%s; extracted here: %s%s",
        summary.samples,
        summary.expected,
        summary.tokens,
        summary.bytes / GB,
        len(summary.complete),
        len(plan.shards),
        f"; not complete: {sorted(failed)}" if failed else "",
        summary.extracted,
        f", by other runs: {summary.by_other_runs}" if summary.by_other_runs else "",
    )
    return summary


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


def shard_row(
    shard: int, expected: int, m: ShardManifest | None, failure: str | None, result: ShardResult | None = None
) -> dict[str, Any]:
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
        "by": by_whom(result),
    }


def by_whom(r: ShardResult | None) -> str:
    """Who extracted the shard, as far as this flow run knows."""
    if r is None:
        return ""
    if r.status == "complete":
        return f"this run: {r.server}"
    if r.status == "by-other-run":
        return f"another run: {r.holder}"[:200]
    return "complete before this run" if r.status == "skipped" else r.status


def summary_markdown(s: ExtractSummary, info: RunInfo | None) -> str:
    lines = [
        f"# Extraction: `{s.run_dir}`",
        "",
        f"- samples: **{s.samples} / {s.expected}**, tokens: {s.tokens}, size: {s.bytes / GB:.3f} GB",
        f"- shards complete: {len(s.complete)} / {len(s.shards)}",
    ]
    if s.failed:
        lines.append(f"- **not complete: {', '.join(str(x) for x in sorted(s.failed))}** (see the shard table)")
    for server, shards in s.servers.items():
        lines.append(f"- extracted by {server}: shards {shards}")
    if s.by_other_runs:
        lines.append(f"- extracted by other flow runs sharing this run directory: shards {s.by_other_runs}")
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
