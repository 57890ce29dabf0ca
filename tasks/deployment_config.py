"""The config a flow run works with: what its parameters gave, merged deeply over its deployment's own `config`.

Prefect replaces a deployment's `config` parameter whole when a run gives one (`prefect deployment run
train/train --params '{"config": {"run_dir": ...}}'`), so without this the train deployment would run the
pipeline's default stages on `auto` devices. eagle3/config_merge.py does the merge; this module finds the two
sides: the flow run's own parameters and its deployment's, read from the server.
"""

from __future__ import annotations

from typing import Any

from prefect import get_client, get_run_logger
from prefect.context import FlowRunContext

from eagle3.config import PipelineConfig
from eagle3.config_merge import ConfigSources, merge_config
from tasks.failure import run_dir_is


def deployment_config(config: PipelineConfig, overrides: tuple[str, ...] = ()) -> tuple[PipelineConfig, ConfigSources]:
    """Called first in a flow that takes `config` (through tasks/flow_start.py, or alone): for a run of a
    deployment, the run's given config and then its `overrides` (`key.sub=value` lines) merged over the deployment's
    own (key by key, deeply), and where each value came from; any other run (`eagle3 run`, a subflow) gets `config`
    with its `overrides`. The run's failure report is keyed by the merged run_dir from here on."""
    merged, sources = merged_config(config, overrides)
    run_dir_is(merged.run_dir)
    return merged, sources


def merged_config(config: PipelineConfig, overrides: tuple[str, ...]) -> tuple[PipelineConfig, ConfigSources]:
    ctx = FlowRunContext.get()
    deployment_id = ctx.flow_run.deployment_id if ctx is not None and ctx.flow_run is not None else None
    if ctx is None or ctx.flow_run is None or deployment_id is None:
        if not overrides:
            return config, ConfigSources()
        merged, _ = merge_config(config.model_dump(mode="json"), {}, None, overrides)
        return merged, ConfigSources()
    with get_client(sync_client=True) as client:
        deployment = client.read_deployment(deployment_id)
    name = f"{ctx.flow.name if ctx.flow else deployment.flow_id}/{deployment.name}"
    own: dict[str, Any] = (deployment.parameters or {}).get("config") or {}
    given: dict[str, Any] = (ctx.flow_run.parameters or {}).get("config") or {}
    try:
        merged, sources = merge_config(own, given, name, overrides)
    except ValueError as e:  # pydantic names the key; say which two configs met
        raise ValueError(f"this run's `config` merged over the deployment {name}'s does not validate: {e}") from None
    logger = get_run_logger()
    for line in sources.lines():
        logger.info("%s", line)
    return merged, sources
