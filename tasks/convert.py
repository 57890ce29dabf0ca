"""convert: the draft vocabulary map, length index and interop layouts (eagle3.convert.convert)."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from eagle3.config import PipelineConfig
from eagle3.convert import ConvertResult, convert
from eagle3.store.run_store import RunStore
from tasks.artifacts import run_key
from tasks.progress import TaskProgress

CONVERT_TIMEOUT_S = 6 * 3600  # reads every sample file once (the store can be ~1 TB)


@task(name="convert", retries=0, timeout_seconds=CONVERT_TIMEOUT_S, cache_policy=NO_CACHE)
def convert_task(config: PipelineConfig) -> ConvertResult:
    """Build what training reads from the store. Deterministic, so never retried."""
    logger = get_run_logger()
    report = TaskProgress(logger, "convert", key=run_key(config.run_dir, "convert-progress"), unit="samples")
    with report:
        result = convert(config, RunStore(config.run_dir), report)
    logger.info("convert: %s", result)
    return result
