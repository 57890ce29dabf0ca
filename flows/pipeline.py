"""The pipeline flow: the stages of README.md's short tour, one line per stage, in `config.stages` order."""

from __future__ import annotations

from prefect import flow
from prefect.states import State

from eagle3.config import PipelineConfig
from flows.extract import extract_flow
from flows.train import draft_stages
from tasks.convert import convert_task
from tasks.failure import reports_failure
from tasks.flow_context import flow_context
from tasks.flow_start import start_flow
from tasks.preflight import preflight_task
from tasks.prepare import prepare_task
from tasks.progress import ENDS_PROGRESS
from tasks.prompts import prompts_task
from tasks.synthesize import synthesize_task


@flow(name="pipeline", flow_run_name="pipeline {config.run_dir}", validate_parameters=True, **ENDS_PROGRESS)
@reports_failure
def pipeline(config: PipelineConfig, overrides: tuple[str, ...] = ()) -> str | State:
    """[prompts] ─► prepare ─► [synthesize] ─► extract (subflow, per shard) ─► convert ─► train ─► export ─►
    evaluate ─► summary

    Runs the stages listed in `config.stages`; returns the run directory (the store). The last artifact,
    `<run>-run-summary`, says what the run left where and links the stages' artifacts. Ends Failed when the
    live evaluation finds the draft slower than the plain target.

    Args:
        config: The run: its own run directory (the store), the target model, the stages, and one section of
            settings per stage (eagle3/config/, docs/formats.md).
        overrides: Any other setting, one `key.sub=value` per line (e.g. `train.max_steps=100`), as `eagle3 run --set`
            takes them; every key is in eagle3/config/ and docs/formats.md. Applied over `config`.
    """
    config, model_dir, sources = start_flow(config, overrides)  # a partial `config` keeps the deployment's settings
    preflight_task(config, model_dir)  # what a later stage would refuse, refused before the first runs
    with flow_context() as ctx:  # one launch of each SGLang server for prompts, synthesize and extract; then stopped
        if "prompts" in config.stages:
            prompts_task(config, model_dir, ctx)
        if "prepare" in config.stages:
            prepare_task(config, model_dir)
        if "synthesize" in config.stages:
            synthesize_task(config, model_dir, ctx)
        if "extract" in config.stages:
            extract_flow(config)  # a subflow: its own context shares these servers (tasks/flow_context.py)
    if "convert" in config.stages:
        convert_task(config)
    return draft_stages(config, model_dir, sources) or config.run_dir  # train, export, evaluate, the run summary
