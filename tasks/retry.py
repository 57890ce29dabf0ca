"""retry: what a retry of a run directory redoes, around `eagle3.store.failed_shards.plan_retry_samples`."""

from __future__ import annotations

import time

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from eagle3.config import PipelineConfig
from eagle3.progress import Progress
from eagle3.store.failed_shards import plan_retry_samples
from eagle3.store.nearby import NothingExtractedError, require_store
from eagle3.store.run_store import RunStore
from tasks.artifacts import run_key, table_artifact
from tasks.progress import TaskProgress

PLAN_TIMEOUT_S = 30 * 60  # a header check of every sample file of the shards that need it


@task(name="run-config", retries=0, timeout_seconds=60, cache_policy=NO_CACHE)
def run_config_task(run_dir: str) -> PipelineConfig:
    """The config the run directory was extracted with (run.json), pointed at `run_dir` as it is now (a store
    may have moved) and at the model directory run.json recorded (open-run checks its fingerprint)."""
    store = RunStore(run_dir)
    require_store(store.root, "nothing to retry")  # a wrong path says so (with the stores nearby)
    info = store.read_run_info()
    if info is None:
        raise NothingExtractedError(f"{store.run_json} missing: nothing was extracted into {run_dir}; nothing to retry")
    return PipelineConfig.model_validate({**info.config, "run_dir": run_dir, "model": info.model_path})


@task(name="plan-retry", retries=0, timeout_seconds=PLAN_TIMEOUT_S, cache_policy=NO_CACHE)
def plan_retry_task(config: PipelineConfig, shards: list[int] | None = None) -> list[int]:
    """The shards to redo: failed, partial, left running by a killed run, or complete on paper with files
    missing (with `shards`: exactly those that miss something). Table artifact: shard, samples to redo."""
    key = run_key(config.run_dir, "retry-plan-progress")
    start = time.monotonic()
    with TaskProgress(get_run_logger(), "plan-retry", key=key, unit="shards") as report:  # reads file headers
        plan = plan_retry_samples(RunStore(config.run_dir), shards)
        report(Progress("plan-retry", len(plan), len(plan), 0, time.monotonic() - start))
    rows = [{"shard": s, "samples to redo": len(ids), "first": ", ".join(ids[:3])} for s, ids in plan.items()]
    table_artifact(
        run_key(config.run_dir, "retry-plan"),
        rows,
        f"retry of {config.run_dir}: {len(plan)} shards, {sum(len(v) for v in plan.values())} samples"
        if plan
        else "Nothing to retry: every shard that was started is complete.",
    )
    get_run_logger().info(
        "retry plan: %s", ", ".join(f"shard {s}: {len(ids)} samples" for s, ids in plan.items()) or "nothing to redo"
    )
    return sorted(plan)
