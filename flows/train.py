"""The train flow: train the draft on a converted store, export it for SGLang, evaluate it.

The pipeline flow runs the same tasks after extract and convert; this flow is the deployment to
(re)train on a store that already exists, e.g. with other `train` settings into another run directory.
"""

from __future__ import annotations

from prefect import flow
from prefect.states import State

from eagle3.config import PipelineConfig
from eagle3.config_merge import ConfigSources
from tasks.evaluate import EvalSummary, evaluate_task, evaluation_outcome
from tasks.export import export_task
from tasks.failure import reports_failure
from tasks.flow_start import start_flow
from tasks.methods import compare_methods_task, with_method
from tasks.preflight import stages_preflight_task
from tasks.progress import ENDS_PROGRESS
from tasks.promote import promote_task
from tasks.summary import run_summary_task
from tasks.train import GPU_LIMIT, train_task
from tasks.train_fanout import train_on_nodes

#: The stages the train flows run (others in `config.stages` are ignored here).
DRAFT_STAGES = ("train", "export", "evaluate")


def draft_stages(config: PipelineConfig, model_dir: str, sources: ConfigSources) -> State | None:
    """For each method of train.trained_methods() (one, or train.methods), the train, export and evaluate stages
    listed in `config.stages`, each into the method's own directory; with several, the methods compared side by
    side; then promotion of the chosen draft to `draft/current` when it is not worse, and the run summary (saying
    where the settings came from: `sources`). Failed when the promoted candidate slows serving or a training node
    failed. With train.nodes > 1 training is one `train-node` flow run per node (train.work_queues), watched here."""
    methods = config.train.trained_methods()
    evaluations: dict[str, EvalSummary] = {}
    for method in methods:
        one = with_method(config, method)
        evaluation = method_stages(one, model_dir, f" [{method}]" if len(methods) > 1 else None)
        if isinstance(evaluation, State):
            return evaluation
        if evaluation is not None:
            evaluations[method] = evaluation
    if not evaluations:
        run_summary_task(config, sources)
        return None
    method, why = compare_methods_task(config, evaluations) if len(evaluations) > 1 else (methods[0], "")
    chosen = with_method(config, method)
    promote_task(chosen, model_dir, evaluations[method], why)
    run_summary_task(config, sources)
    return evaluation_outcome(chosen, evaluations[method])


def method_stages(config: PipelineConfig, model_dir: str, tag: str | None) -> EvalSummary | State | None:
    """train -> export -> evaluate of train.method (those of them in config.stages); None when nothing was evaluated
    (the stage is not listed, or the store grew by fewer than train.min_new_tokens since the last training). `tag`
    (" [eagle3.1]") ends the task runs' names when several methods train."""
    trained = None
    if "train" in config.stages and config.train.nodes > 1:  # one flow run per node (tasks/train_fanout.py)
        on_nodes = train_on_nodes(config, TRAIN_NODE_DEPLOYMENT)
        if isinstance(on_nodes, State):
            return on_nodes
    elif "train" in config.stages:
        trained = train_task.with_options(task_run_name=f"train{tag}" if tag else None)(config, model_dir)
    if trained is not None and trained.waiting:
        return None
    if "export" in config.stages:
        export_task.with_options(task_run_name=f"export{tag}" if tag else None)(config, model_dir)
    if "evaluate" not in config.stages:
        return None
    return evaluate_task.with_options(task_run_name=f"evaluate{tag}" if tag else None)(config, model_dir)


@flow(name="train", flow_run_name="train {config.run_dir}", validate_parameters=True, **ENDS_PROGRESS)
@reports_failure
def train_flow(config: PipelineConfig, overrides: tuple[str, ...] = ()) -> str | State:
    """train (torchrun, holding the `gpu` limit) ─► export ─► evaluate, for the train/export/evaluate
    stages listed in `config.stages` (others are ignored here). Returns the run directory; Failed when the
    live evaluation finds the draft slower than the plain target.

    Args:
        config: The converted store, the target model, and the train and evaluate settings.
        overrides: Any other setting, one `key.sub=value` per line (e.g. `evaluate.num_prompts=4`), as `eagle3 run
            --set` takes them (eagle3/config/, docs/formats.md). Applied over `config`.
    """
    config, model_dir, sources = start_flow(config, overrides)  # a partial `config` keeps the deployment's settings
    stages_preflight_task(config, model_dir, [s for s in config.stages if s in DRAFT_STAGES])  # before training
    return draft_stages(config, model_dir, sources) or config.run_dir


@flow(
    name="train-node",
    flow_run_name="train {config.run_dir} [node {config.train.node_rank}]",
    validate_parameters=True,
    **ENDS_PROGRESS,
)
@reports_failure
def train_node_flow(
    config: PipelineConfig, rendezvous_token: str = "", gpu_limit: str = GPU_LIMIT, overrides: tuple[str, ...] = ()
) -> str:
    """One node's torchrun of a multi-node training (the train-fanout flow starts one per node; export and
    evaluate run once, in the fan-out, after every node finished). Returns the run directory.

    Args:
        config: The run; `train.nodes` and `train.node_rank` place this node (the fan-out sets them).
        rendezvous_token: The launch whose rendezvous port node 0 publishes in `<run_dir>/train/rendezvous/` (the
            fan-out's flow run id). Empty: train.rdzv_endpoint must name the port.
        gpu_limit: This node's concurrency limit (`gpu-<work queue>`), held for `train.nproc` slots.
        overrides: Any other setting, one `key.sub=value` per line, as `eagle3 run --set` takes them.
    """
    config, model_dir, _ = start_flow(config, overrides)  # a partial `config` keeps the deployment's settings
    stages_preflight_task(config, model_dir, ["train"], train_here=True)  # this node's device, the vocabulary map
    train_task(config, model_dir, rendezvous_token or None, gpu_limit)
    return config.run_dir


#: The deployment of train_node_flow (deploy/prefect.yaml), one flow run per node of a multi-node training.
TRAIN_NODE_DEPLOYMENT = f"{train_node_flow.name}/train-node"
