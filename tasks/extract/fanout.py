"""extract-fanout: one extract flow run per node on one run directory, started through a deployment, watched, and
summed up into one progress/ETA view and one table.

    launch_children_task   one child per node (its work queue: tasks/children.py), extract.share_run_dir on
    watch_children_task    until every child ends: the run's progress artifact from the store (shared storage),
                           the children's states
    report_fanout_task     each child's shard table artifact (which shards it extracted) + the store's manifests

The children split the shards by lease (eagle3/store/lease.py), so the parent decides nothing about who does what.
"""

from __future__ import annotations

import json
import time
from typing import Any
from uuid import UUID

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey
from prefect.client.schemas.sorting import ArtifactSort
from prefect.runtime import flow_run
from prefect.states import Failed, State
from pydantic import BaseModel

from eagle3.config import PipelineConfig
from eagle3.config_merge import without_nulls
from eagle3.extract.shard import samples_on_disk
from eagle3.store.run_store import RunStore
from tasks.artifacts import markdown_artifact, run_key, table_artifact
from tasks.children import FINAL, WATCH_TIMEOUT_S, ChildRun, child_states, launch_children
from tasks.progress import ProgressArtifact, describe


class ChildResult(BaseModel):
    id: str
    name: str
    work_queue: str | None
    state: str  # the state's name (Completed, Failed, Crashed, ...)
    state_type: str
    message: str
    extracted: list[int]  # shards this child extracted (its shard table)


class FanoutSummary(BaseModel):
    run_dir: str
    children: list[ChildResult]
    shards: int
    complete: list[int]
    samples: int
    expected: int


class FanoutIncomplete(RuntimeError):
    """A child flow run did not complete, or a shard is not complete."""


def child_config(config: PipelineConfig) -> PipelineConfig:
    """The config every child runs: the parent's, with the run directory shared between flow runs."""
    return config.model_copy(update={"extract": config.extract.model_copy(update={"share_run_dir": True})})


@task(name="launch-children", retries=1, retry_delay_seconds=10, timeout_seconds=600, cache_policy=NO_CACHE)
def launch_children_task(config: PipelineConfig, deployment: str, work_queues: list[str | None]) -> list[ChildRun]:
    """One flow run of `deployment` per entry of `work_queues` (None: the deployment's own queue), started
    without waiting. Idempotent per parent flow run: a retry of this task does not start them twice."""
    store = RunStore(config.run_dir)
    if store.read_prepared_manifest() is None:
        raise FileNotFoundError(
            f"{store.prepared_dir}/manifest.json missing: run the prepare stage first (`eagle3 run CONFIG --stages "
            "prepare`); the fan-out only extracts"
        )
    parent = flow_run.get_id() or "local"
    params = {"config": without_nulls(child_config(config).model_dump(mode="json"))}  # the node form's schema: no nulls
    runs = launch_children(
        deployment,
        work_queues,
        parameters=lambda i, queue: params,
        run_name=lambda i, queue: f"extract {config.run_dir} [{queue or 'node'} {i}]",
        key=f"{parent}-child",
    )
    return [ChildRun(id=str(r.id), name=r.name, work_queue=q) for r, q in zip(runs, work_queues, strict=True)]


@task(name="watch-children", retries=0, timeout_seconds=WATCH_TIMEOUT_S, cache_policy=NO_CACHE)
def watch_children_task(config: PipelineConfig, children: list[ChildRun], poll_s: float = 10.0) -> dict[str, str]:
    """Wait for every child to end; meanwhile one progress artifact over the whole run
    (`<run>-extract-fanout-progress`): samples in the store (shared storage) over the prepared total, rate and
    ETA, children still running.
    Returns child id -> final state type."""
    logger = get_run_logger()
    store = RunStore(config.run_dir)
    prepared = store.read_prepared_manifest()
    assert prepared is not None  # launch-children checked it
    shards = list(range(len(prepared.shards)))
    total = prepared.num_samples
    progress = ProgressArtifact(logger, key=run_key(config.run_dir, "extract-fanout-progress"), min_interval_s=0.0)
    first = samples_on_disk(store, shards)
    start = time.monotonic()
    last_log = 0.0
    while True:
        states = child_states(children)
        done = samples_on_disk(store, shards)
        elapsed = time.monotonic() - start
        rate = (done - first) / elapsed if elapsed > 0 and done > first else 0.0
        eta = (total - done) / rate if rate > 0 else None
        running = sum(1 for s in states.values() if s not in FINAL)
        text = describe(done, total, "samples", 0.0, eta, f"{running}/{len(children)} flow runs running")
        text = text.replace(", 0 tok/s", f", {rate:.2f} samples/s")
        progress.update(100.0 * done / total if total else 100.0, text, force=True)
        if time.monotonic() - last_log >= 60 or running == 0:
            logger.info("%s", text)
            last_log = time.monotonic()
        if running == 0:
            return states
        time.sleep(poll_s)


@task(name="report-fanout", retries=1, retry_delay_seconds=2, timeout_seconds=600, cache_policy=NO_CACHE)
def report_fanout_task(config: PipelineConfig, children: list[ChildRun]) -> FanoutSummary:
    """One table over the children (`<run>-extract-fanout`): state, work queue, the shards each extracted (from
    its own shard table artifact); and a markdown summary with the store's totals."""
    store = RunStore(config.run_dir)
    prepared = store.read_prepared_manifest()
    assert prepared is not None
    results = [child_result(config, c) for c in children]
    manifests = [store.read_manifest(s) for s in range(len(prepared.shards))]
    complete = [m.shard for m in manifests if m is not None and m.status == "complete"]
    summary = FanoutSummary(
        run_dir=str(store.root.resolve()),
        children=results,
        shards=len(prepared.shards),
        complete=complete,
        samples=sum(len(m.samples) for m in manifests if m is not None),
        expected=prepared.num_samples,
    )
    rows = [
        {"flow run": r.name, "work queue": r.work_queue or "", "state": r.state, "shards extracted": r.extracted,
         "message": r.message[:300]}
        for r in results
    ]  # fmt: skip
    table_artifact(run_key(config.run_dir, "extract-fanout"), rows, f"Flow runs that extracted {summary.run_dir}")
    markdown_artifact(run_key(config.run_dir, "extract-fanout-summary"), fanout_markdown(summary), "Fan-out summary")
    get_run_logger().info(
        "fan-out: %d/%d samples, %d/%d shards complete; %s",
        summary.samples,
        summary.expected,
        len(complete),
        summary.shards,
        "; ".join(f"{r.name}: {r.state}, extracted {r.extracted}" for r in results),
    )
    return summary


def child_result(config: PipelineConfig, c: ChildRun) -> ChildResult:
    key = run_key(config.run_dir, "extract-shards")
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(UUID(c.id))
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=[key]), flow_run_id=ArtifactFilterFlowRunId(any_=[UUID(c.id)])
            ),
            sort=ArtifactSort.CREATED_DESC,
            limit=1,
        )
    rows: list[dict[str, Any]] = []
    if found:
        data = found[0].data
        loaded = json.loads(data) if isinstance(data, str) else data
        rows = [r for r in loaded if isinstance(r, dict)] if isinstance(loaded, list) else []
    state = run.state
    return ChildResult(
        id=c.id,
        name=c.name,
        work_queue=c.work_queue,
        state=(state.name or state.type.value) if state is not None else "Pending",
        state_type=state.type.value if state is not None else "PENDING",
        message=(state.message or "") if state is not None else "",
        extracted=sorted(int(r["shard"]) for r in rows if str(r.get("by", "")).startswith("this run")),
    )


def fanout_markdown(s: FanoutSummary) -> str:
    lines = [
        f"# Extraction over {len(s.children)} flow runs: `{s.run_dir}`",
        "",
        f"- samples: **{s.samples} / {s.expected}**, shards complete: {len(s.complete)} / {s.shards}",
        "",
        "| flow run | work queue | state | shards extracted |",
        "|---|---|---|---|",
        *(f"| {r.name} | {r.work_queue or ''} | {r.state} | {r.extracted} |" for r in s.children),
        "",
        f"Inspect: `eagle3 status {s.run_dir}`",
    ]
    return "\n".join(lines)


def fanout_outcome(s: FanoutSummary) -> FanoutSummary | State:
    """Completed when every child completed and every shard is complete; Failed naming what is not."""
    bad = [f"{r.name}: {r.state} ({r.message[:200]})" for r in s.children if r.state_type != "COMPLETED"]
    missing = [i for i in range(s.shards) if i not in s.complete]
    if not bad and not missing:
        return s
    message = (
        "; ".join([*bad, *([f"shards not complete: {missing}"] if missing else [])])
        + f". Run the fan-out again, or `eagle3 retry {s.run_dir}`: complete shards are skipped."
    )
    return Failed(message=message, data=FanoutIncomplete(message))
