"""How every flow that takes a `config` starts: the deployment's config merged in, the model found, the run directory
named.

    config, model_dir, sources = start_flow(config, overrides)

1. deployment_config (tasks/deployment_config.py): a run's partial `config` and `overrides` merged over its
   deployment's own config, and where each setting came from (`sources`, for the run summary);
2. resolve_model_task (tasks/model.py): the target model's directory (the demo model installed on first use);
3. run_dir_task (tasks/model.py): `run_dir`'s {date} / {model_sha} filled in, once; every later stage gets this config.
"""

from __future__ import annotations

from typing import NamedTuple

from eagle3.config import PipelineConfig
from eagle3.config_merge import ConfigSources
from tasks.deployment_config import deployment_config
from tasks.model import resolve_model_task, run_dir_task


class FlowStart(NamedTuple):
    config: PipelineConfig  # merged, with its run directory named
    model_dir: str
    sources: ConfigSources


def start_flow(config: PipelineConfig, overrides: tuple[str, ...] = ()) -> FlowStart:
    """The three steps above, in a flow run (each step a task run of its own)."""
    config, sources = deployment_config(config, overrides)
    model_dir = resolve_model_task(config)
    return FlowStart(run_dir_task(config, model_dir), model_dir, sources)
