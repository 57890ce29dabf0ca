"""The train flow: train the draft on a converted store, export it for SGLang, evaluate it.

The pipeline flow runs the same tasks after extract and convert; this flow is the deployment to
(re)train on a store that already exists, e.g. with other `train` settings into another run directory.
"""

from __future__ import annotations

from prefect import flow

from eagle3.config import PipelineConfig
from tasks.artifacts import run_summary_task
from tasks.model import resolve_model_task
from tasks.train import train_task


@flow(name="eagle3-train", flow_run_name="train {config.run_dir}", validate_parameters=True)
def train_flow(config: PipelineConfig) -> str:
    """train (torchrun, holding the `gpu` limit) ─► export ─► evaluate, for the train/export/evaluate
    stages listed in `config.stages` (any others are ignored here). Returns the draft's directory."""
    model_dir = resolve_model_task(config)
    if "train" in config.stages:
        train_task(config, model_dir)
    run_summary_task(config)
    return config.run_dir
