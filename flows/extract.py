"""The extraction flow: hidden states for every prepared shard, one retried task per shard, on every server of
the flow run at once; with `extract.share_run_dir`, together with other flow runs (other nodes) on one run
directory, shard by shard (leases)."""

from __future__ import annotations

from prefect import flow
from prefect.states import State

from eagle3.config import PipelineConfig
from tasks.extract.open_run import disk_budget_task, open_run_task
from tasks.extract.plan import ExtractSummary
from tasks.extract.report import extract_outcome, outcomes, report_extract_task
from tasks.extract.shards import run_shards
from tasks.failure import reports_failure
from tasks.flow_context import flow_context
from tasks.flow_start import start_flow
from tasks.preflight import stages_preflight_task
from tasks.progress import ENDS_PROGRESS


@flow(name="extract", flow_run_name="extract {config.run_dir}", validate_parameters=True, **ENDS_PROGRESS)
@reports_failure
def extract_flow(config: PipelineConfig, overrides: tuple[str, ...] = ()) -> ExtractSummary | State:
    """model ─► hold run_dir ─► open run (run.json) ─► disk budget ─► shards, one per server at a time (each under
    its lease) ─► shards other runs held ─► shard table + summary ─► Failed if a shard failed

    By default a second run on the same run directory refuses (RunLockedError). With `extract.share_run_dir`
    the run directory is held only while run.json is written, and flow runs split the shards by lease. Every
    shard is attempted (with `extract.shard_retries` retries) even when an earlier one failed; complete shards
    are Skipped without loading the model. A disk budget that does not fit fails the run before it writes.

    Args:
        config: The run directory to extract (prepare must have run), the target model, the engine (`server`)
            and the extract settings (eagle3/config/, docs/formats.md).
        overrides: Any other setting, one `key.sub=value` per line (e.g. `train.max_steps=100`), as `eagle3 run --set`
            takes them; every key is in eagle3/config/ and docs/formats.md. Applied over `config`.
    """
    config, model_dir, _ = start_flow(config, overrides)  # a partial `config` keeps the deployment's (extract-node's)
    stages_preflight_task(config, model_dir, ["extract"])  # SGLang's ids and tap, the device, before any server starts
    shared = config.extract.share_run_dir
    ttl_s = config.extract.lease_ttl_s
    with flow_context() as ctx, ctx.hold(config.run_dir, "extract", shared=shared, ttl_s=ttl_s) as hold:
        plan = open_run_task(config, model_dir, ctx=ctx)
        hold.opened()
        disk_budget_task(config, plan)
        results, failures = outcomes(run_shards(config, model_dir, plan, ctx))
        summary = report_extract_task(config, plan, failures, results)
    return extract_outcome(summary)


#: The deployment of extract_flow that the extract-fanout flow starts once per node (deploy/prefect.yaml).
EXTRACT_NODE_DEPLOYMENT = f"{extract_flow.name}/extract-node"
