"""How every flow that takes a `config` starts: the deployment's config merged in, the model found, the run directory
named.

    config, model_dir, sources = start_flow(config, overrides)

1. deployment_config (tasks/deployment_config.py): a run's partial `config` and `overrides` merged over its
   deployment's own config, and where each setting came from (`sources`, for the run summary);
2. resolve_model_task (tasks/model.py): the target model's directory (the demo model installed on first use);
3. run_dir_task (tasks/model.py): `run_dir`'s {date} / {model_sha} filled in, once; every later stage gets this config;
4. end_stale_progress (tasks/progress.py): progress an earlier run on this store left live-looking (its node lost)
   says how that run ended.
"""

from __future__ import annotations

from typing import NamedTuple

from prefect import get_client, get_run_logger
from prefect.context import FlowRunContext

from eagle3.config import PipelineConfig
from eagle3.config_merge import ConfigSources
from tasks.deployment_config import deployment_config
from tasks.failure import run_dir_is
from tasks.model import resolve_model_task, run_dir_task
from tasks.progress import end_stale_progress


class FlowStart(NamedTuple):
    config: PipelineConfig  # merged, with its run directory named
    model_dir: str
    sources: ConfigSources


def start_flow(config: PipelineConfig, overrides: tuple[str, ...] = ()) -> FlowStart:
    """The three steps above, in a flow run (each step a task run of its own). A run_dir filled in also renames
    the flow run (`pipeline data/runs/ui-grow-3f2a...`, not the template) and keys its failure report."""
    config, sources = deployment_config(config, overrides)
    model_dir = resolve_model_task(config)
    named = run_dir_task(config, model_dir)
    if named.run_dir != config.run_dir:
        run_dir_is(named.run_dir)
        rename_flow_run(config.run_dir, named.run_dir)
    try:  # an earlier run on this store that lost its node left live-looking progress: it ended
        end_stale_progress(named.run_dir)
    except Exception as e:
        get_run_logger().warning("progress of earlier runs on %s: not checked (%s)", named.run_dir, e)
    return FlowStart(named, model_dir, sources)


def rename_flow_run(template: str, run_dir: str) -> None:
    """This flow run's name with the template replaced by the run directory it named; a view, never fails the run."""
    ctx = FlowRunContext.get()
    if ctx is None or ctx.flow_run is None or template not in ctx.flow_run.name:
        return
    try:
        with get_client(sync_client=True) as client:
            client.update_flow_run(ctx.flow_run.id, name=ctx.flow_run.name.replace(template, run_dir))
    except Exception as e:
        get_run_logger().warning("flow run name: not renamed to %s (%s)", run_dir, e)
