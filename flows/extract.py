"""The extraction flow: hidden states for every prepared shard, one retried task per shard."""

from __future__ import annotations

from prefect import flow
from prefect.states import State

from eagle3.config import PipelineConfig
from tasks.extract import (
    ExtractSummary,
    disk_budget_task,
    engine_session,
    extract_outcome,
    extract_shard_task,
    failure_messages,
    open_run_task,
    report_extract_task,
    run_lock,
)
from tasks.model import resolve_model_task


@flow(name="extract", flow_run_name="extract {config.run_dir}", validate_parameters=True)
def extract_flow(config: PipelineConfig) -> ExtractSummary | State:
    """model ─► lock run_dir ─► open run (run.json) ─► disk budget ─► shard 0 ─► shard 1 ─► … ─► shard table +
    summary ─► Failed if a shard failed

    A second run on the same run directory refuses (RunLockedError). Every shard is attempted (with
    `extract.shard_retries` retries) even when an earlier one failed; complete shards are Skipped without
    loading the model. A disk budget that does not fit fails the run (or the shard) before it writes.
    """
    model_dir = resolve_model_task(config)
    with run_lock(config.run_dir, purpose="extract"), engine_session():
        plan = open_run_task(config, model_dir)
        disk_budget_task(config, plan)
        run_shard = extract_shard_task.with_options(retries=config.extract.shard_retries)
        states = {s: run_shard(config, model_dir, s, plan.progress_for(s), return_state=True) for s in plan.shards}
        summary = report_extract_task(config, plan, failure_messages(states))
    return extract_outcome(summary)
