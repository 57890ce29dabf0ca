"""The train flow: train the draft on a converted store, export it for SGLang, evaluate it.

The pipeline flow runs the same tasks after extract and convert; this flow is the deployment to
(re)train on a store that already exists, e.g. with other `train` settings into another run directory.
"""

from __future__ import annotations

from prefect import flow
from prefect.states import State

from eagle3.config import PipelineConfig
from eagle3.config_merge import ConfigSources
from tasks.deployment_config import deployment_config
from tasks.evaluate import evaluate_task, evaluation_outcome
from tasks.export import export_task
from tasks.failure import reports_failure
from tasks.model import resolve_model_task, run_dir_task
from tasks.promote import promote_task
from tasks.summary import run_summary_task
from tasks.train import train_task


def draft_stages(config: PipelineConfig, model_dir: str, sources: ConfigSources) -> State | None:
    """The train, export and evaluate stages listed in `config.stages`, then promotion of the evaluated draft to
    `draft/current` when it is not worse, and the run summary (saying where the settings came from: `sources`);
    Failed when the draft slows serving."""
    trained = train_task(config, model_dir) if "train" in config.stages else None
    if trained is not None and trained.waiting:  # the store grew by fewer than train.min_new_tokens
        run_summary_task(config, sources)
        return None
    if "export" in config.stages:
        export_task(config, model_dir)
    evaluation = evaluate_task(config, model_dir) if "evaluate" in config.stages else None
    if evaluation is not None:
        promote_task(config, model_dir, evaluation)
    run_summary_task(config, sources)
    return evaluation_outcome(config, evaluation)


@flow(name="eagle3-train", flow_run_name="train {config.run_dir}", validate_parameters=True)
@reports_failure
def train_flow(config: PipelineConfig, overrides: tuple[str, ...] = ()) -> str | State:
    """train (torchrun, holding the `gpu` limit) ─► export ─► evaluate, for the train/export/evaluate
    stages listed in `config.stages` (others are ignored here). Returns the run directory; Failed when the
    live evaluation finds the draft slower than the plain target.

    Args:
        config: The converted run directory to train on, the target model, and the train and evaluate settings
            (eagle3/config.py, docs/formats.md).
        overrides: Any other setting, one `key.sub=value` per line (e.g. `train.max_steps=100`), as `eagle3 run --set`
            takes them; every key is in eagle3/config.py and docs/formats.md. Applied over `config`.
    """
    config, sources = deployment_config(config, overrides)  # a partial `config` keeps the deployment's own settings
    model_dir = resolve_model_task(config)
    config = run_dir_task(config, model_dir)
    return draft_stages(config, model_dir, sources) or config.run_dir
