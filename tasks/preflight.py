"""preflight: refuse before the first stage what a later stage would refuse (eagle3.checks.preflight.check_run); the
flows other than the pipeline check, before their first stage, that SGLang can serve what their stages would make
(check_serving)."""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from eagle3.checks.preflight import check_methods, check_run, check_serving
from eagle3.config import PipelineConfig

PREFLIGHT_TIMEOUT_S = 10 * 60  # hashes the model directory's small files and reads a few JSON files


@task(name="preflight", retries=0, timeout_seconds=PREFLIGHT_TIMEOUT_S, cache_policy=NO_CACHE)
def preflight_task(config: PipelineConfig, model_dir: str) -> None:
    """Check the run's settings against each other, the model and the store's records; fails naming the keys and
    the fix. Deterministic, so never retried."""
    check_run(config, Path(model_dir))
    get_run_logger().info("preflight: stages %s fit %s", config.stages, config.run_dir)


@task(name="preflight-serving", retries=0, timeout_seconds=PREFLIGHT_TIMEOUT_S, cache_policy=NO_CACHE)
def serving_preflight_task(config: PipelineConfig, model_dir: str, stages: list[str]) -> None:
    """Refuse, before the first of `stages` (those this flow runs), a target SGLang cannot serve an EAGLE-3 draft of
    as the pipeline stores it, when one of them needs SGLang (extract through SGLang, export, live evaluation), and a
    draft method that cannot train on the store's layers."""
    only = config.model_copy(update={"stages": stages})
    check_serving(only, Path(model_dir))
    check_methods(only, Path(model_dir))
