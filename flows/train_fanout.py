"""The train fan-out flow: one training over several nodes, one child `train-node` flow run per node, then export
and evaluate once."""

from __future__ import annotations

from prefect import flow
from prefect.states import State

from eagle3.config import PipelineConfig
from flows.train import DRAFT_STAGES, TRAIN_NODE_DEPLOYMENT, draft_stages
from tasks.failure import reports_failure
from tasks.flow_start import start_flow
from tasks.preflight import stages_preflight_task
from tasks.progress import ENDS_PROGRESS
from tasks.train_fanout import TrainFanoutSummary, train_on_nodes


@flow(name="train-fanout", flow_run_name="train-fanout {config.run_dir}", validate_parameters=True, **ENDS_PROGRESS)
@reports_failure
def train_fanout_flow(
    config: PipelineConfig,
    deployment: str = TRAIN_NODE_DEPLOYMENT,
    poll_s: float = 10.0,
    overrides: tuple[str, ...] = (),
) -> TrainFanoutSummary | State:
    """start one `train-node` flow run per node (torchrun on each, c10d rendezvous at node 0) ─► watch: one
    progress/ETA for the job, the first node that fails cancels the rest ─► table of nodes ─► export ─► evaluate
    (the stages `config.stages` lists besides train). Failed naming the node that failed first and its error.

    `config.train.work_queues`: node i is the worker of work queue i (start each node's worker with `--work-queue
    <its queue>`); it holds `train.nproc` slots of the limit `gpu-<its queue>`. Empty: `train.nodes` runs on the
    deployment's queue. The store and `<run_dir>/train` must be on a filesystem every node sees at the same path.
    The pipeline and train flows do the same when `train.nodes` > 1.

    Args:
        config: The converted run directory, the target model, the train settings (per node) and the evaluate ones.
        deployment: The deployment each node runs (flow/deployment).
        poll_s: Seconds between looks at the metrics and the nodes' states.
        overrides: Any other setting, one `key.sub=value` per line (e.g. `train.max_steps=100`), as `eagle3 run --set`
            takes them; every key is in eagle3/config/ and docs/formats.md. Applied over `config`.
    """
    config, model_dir, sources = start_flow(config, overrides)  # a partial `config` keeps the deployment's settings
    stages_preflight_task(config, model_dir, [s for s in config.stages if s in DRAFT_STAGES])  # before training
    trained = train_on_nodes(config, deployment, poll_s)
    if isinstance(trained, State):
        return trained
    after = config.model_copy(update={"stages": [s for s in config.stages if s != "train"]})
    return draft_stages(after, model_dir, sources) or trained
