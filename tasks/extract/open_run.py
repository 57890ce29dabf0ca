"""The run-level tasks before any shard: open the run (write or check run.json, plan the shards, start the
run's progress artifact) and the disk budget of the samples still missing.
"""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from eagle3.config import PipelineConfig
from eagle3.extract.disk import DiskBudgetError, fmt_bytes, run_budget
from eagle3.extract.shard import open_run
from eagle3.store.run_store import RunStore
from tasks.extract.plan import (
    ExtractPlan,
    select_shards,
)
from tasks.extract.report import disk_low
from tasks.flow_context import FlowContext
from tasks.progress import create_run_progress
from tasks.server import reap_orphan_servers

OPEN_RUN_TIMEOUT_S = 15 * 60  # hashes the model directory (weights > 64 MiB: first and last MiB only)
BUDGET_TIMEOUT_S = 10 * 60  # reads every shard manifest; with disk.budget_gb also walks the store


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
