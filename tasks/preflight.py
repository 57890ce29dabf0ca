"""preflight: refuse before the first stage what a later stage would refuse (eagle3.checks.preflight.check_run)."""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from eagle3.checks.preflight import check_run
from eagle3.config import PipelineConfig

PREFLIGHT_TIMEOUT_S = 10 * 60  # hashes the model directory's small files and reads a few JSON files


@task(name="preflight", retries=0, timeout_seconds=PREFLIGHT_TIMEOUT_S, cache_policy=NO_CACHE)
def preflight_task(config: PipelineConfig, model_dir: str) -> None:
    """Check the run's settings against each other, the model and the store's records; fails naming the keys and
    the fix. Deterministic, so never retried."""
    check_run(config, Path(model_dir))
    get_run_logger().info("preflight: stages %s fit %s", config.stages, config.run_dir)
