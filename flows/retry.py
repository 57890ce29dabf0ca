"""The retry-failed flow: redo only the failed or partial shards of a run directory, only their missing samples."""

from __future__ import annotations

from prefect import flow
from prefect.states import State

from tasks.extract.open_run import disk_budget_task, open_run_task
from tasks.extract.plan import ExtractSummary
from tasks.extract.report import extract_outcome, outcomes, report_extract_task
from tasks.extract.shards import run_shards
from tasks.failure import reports_failure
from tasks.flow_context import flow_context
from tasks.model import resolve_model_task
from tasks.preflight import stages_preflight_task
from tasks.progress import ENDS_PROGRESS
from tasks.retry import plan_retry_task, run_config_task


@flow(name="retry-failed", flow_run_name="retry-failed {run_dir}", validate_parameters=True, **ENDS_PROGRESS)
@reports_failure
def retry_failed_flow(run_dir: str, shards: tuple[int, ...] = ()) -> ExtractSummary | State:
    """run.json's config ─► lock run_dir ─► plan (failed/partial shards, or `shards`) ─► model ─► open run ─►
    disk budget ─► each planned shard (only its missing samples, under its lease) ─► shard table + summary ─►
    Failed if one is still not complete

    The same shard task as the extract flow: sound files are adopted, the engine sees only missing samples.

    Args:
        run_dir: The run directory (store) to repair, e.g. data/runs/demo; relative to the project directory. Its
            run.json gives the config (model, engine, layers) the retry runs with.
        shards: Shard ids to redo, e.g. [1, 4] (a shard never started runs only when named here). Empty: every
            failed or partial shard, and any with sample files missing.
    """
    config = run_config_task(run_dir)
    with flow_context() as ctx, ctx.hold(run_dir, "retry", ttl_s=config.extract.lease_ttl_s):
        todo = plan_retry_task(config, list(shards) or None)
        model_dir = resolve_model_task(config)
        stages_preflight_task(config, model_dir, ["extract"])  # this worker's device, SGLang's ids and tap
        plan = open_run_task(config, model_dir, ctx=ctx, shards=todo)
        disk_budget_task(config, plan)
        results, failures = outcomes(run_shards(config, model_dir, plan, ctx))
        summary = report_extract_task(config, plan, failures, results)
    return extract_outcome(summary)
