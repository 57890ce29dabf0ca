"""The fan-out flow: one run directory extracted by several nodes at once, one child extract flow run per node."""

from __future__ import annotations

from prefect import flow
from prefect.states import State

from eagle3.config import PipelineConfig
from flows.extract import EXTRACT_NODE_DEPLOYMENT
from tasks.extract.fanout import (
    FanoutSummary,
    fanout_outcome,
    launch_children_task,
    report_fanout_task,
    watch_children_task,
)
from tasks.failure import reports_failure
from tasks.flow_start import start_flow
from tasks.preflight import preflight_task
from tasks.progress import ENDS_PROGRESS


@flow(name="extract-fanout", flow_run_name="extract-fanout {config.run_dir}", validate_parameters=True, **ENDS_PROGRESS)
@reports_failure
def extract_fanout_flow(
    config: PipelineConfig,
    overrides: tuple[str, ...] = (),
    work_queues: tuple[str, ...] = (),
    nodes: int = 2,
    deployment: str = EXTRACT_NODE_DEPLOYMENT,
    poll_s: float = 10.0,
) -> FanoutSummary | State:
    """preflight ─► start one child flow run of `deployment` per node ─► watch: one progress/ETA over the store ─►
    wait for every child ─► table of children and the shards each extracted ─► Failed if a child failed or a shard
    is not complete

    `work_queues`: one child per queue; start each node's worker with `--work-queue <its queue>` so every node
    runs exactly one child. Without it, `nodes` children go to the deployment's queue (any worker may take
    several). The children share the run directory (`extract.share_run_dir`) and split its shards by lease.
    Prepare must have run.

    Args:
        config: The run: its run directory, model and engine, and the extract settings every child uses.
        overrides: Any other setting, one `key.sub=value` per line (e.g. `train.max_steps=100`), as `eagle3 run --set`
            takes them; every key is in eagle3/config/ and docs/formats.md. Applied over `config`.
        work_queues: One child flow run per work queue, e.g. [node-1, node-2]: start each node's worker with
            `--work-queue <its queue>`. Empty: `nodes` children on the deployment's own queue.
        nodes: How many children to start when `work_queues` is empty.
        deployment: The deployment each child runs (flow/deployment); it must share the run directory.
        poll_s: Seconds between looks at the store and the children (progress, ETA, their states).
    """
    config, model_dir, _ = start_flow(config, overrides)  # a partial `config` keeps the deployment's own settings
    # What every node's extraction would refuse (the layers, SGLang serving, the store's records), refused before
    # any node starts; each node checks its own devices.
    preflight_task(config.model_copy(update={"stages": ["extract"]}), model_dir, on_nodes=True)
    queues: list[str | None] = list(work_queues) if work_queues else [None] * nodes
    children = launch_children_task(config, deployment, queues)
    watch_children_task(config, children, poll_s)
    return fanout_outcome(report_fanout_task(config, children))
