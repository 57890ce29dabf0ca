"""The train fan-out flow: one training over several nodes, one child `train-node` flow run per node, then export
and evaluate once."""

from __future__ import annotations

from prefect import flow
from prefect.states import State

from eagle3.config import PipelineConfig
from flows.train import draft_stages
from tasks.failure import reports_failure
from tasks.model import resolve_model_task, run_dir_task
from tasks.train_fanout import (
    TrainFanoutSummary,
    launch_train_nodes_task,
    train_fanout_outcome,
    train_fanout_summary,
    watch_train_nodes_task,
)

NODE_DEPLOYMENT = "train-node/train-node"


@flow(name="train-fanout", flow_run_name="train-fanout {config.run_dir}", validate_parameters=True)
@reports_failure
def train_fanout_flow(
    config: PipelineConfig,
    work_queues: tuple[str, ...] = (),
    deployment: str = NODE_DEPLOYMENT,
    poll_s: float = 10.0,
) -> TrainFanoutSummary | State:
    """start one `train-node` flow run per node (torchrun on each, c10d rendezvous at node 0) ─► watch: one
    progress/ETA for the job, the first node that fails cancels the rest ─► table of nodes ─► export ─► evaluate
    (the stages `config.stages` lists besides train). Failed naming the node that failed first and its error.

    `work_queues`: node i is the worker of work_queues[i] (start each node's worker with `--work-queue <its
    queue>`); it holds `train.nproc` slots of the limit `gpu-<its queue>`. Empty: `train.nodes` children on the
    deployment's queue. The store and `<run_dir>/train` must be on a filesystem every node sees at the same path.

    Args:
        config: The converted run directory, the target model, the train settings (train.nproc per node;
            train.rdzv_endpoint: node 0's host, or host:port) and the evaluate settings.
        work_queues: One node per work queue, e.g. [node-1, node-2]; node 0 (the first) hosts the rendezvous.
        deployment: The deployment each node runs (flow/deployment).
        poll_s: Seconds between looks at the metrics and the nodes' states.
    """
    model_dir = resolve_model_task(config)
    config = run_dir_task(config, model_dir)
    queues: list[str | None] = list(work_queues) if work_queues else [None] * config.train.nodes
    runs = launch_train_nodes_task(config, deployment, queues)
    summary = train_fanout_summary(config, watch_train_nodes_task(config, runs, poll_s))
    outcome = train_fanout_outcome(summary)
    if isinstance(outcome, State):
        return outcome
    after = config.model_copy(update={"stages": [s for s in config.stages if s != "train"]})
    return draft_stages(after, model_dir) or summary
