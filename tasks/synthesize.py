"""synthesize: regenerate assistant turns with the target model (eagle3.synthesize.synthesize)."""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from eagle3.config import PipelineConfig
from eagle3.store import PreparedManifest, RunStore
from eagle3.synthesize import synthesize
from tasks.artifacts import TaskProgress, run_key

SYNTHESIZE_TIMEOUT_S = 48 * 3600  # the case study generated 10K conversations


@task(name="synthesize", retries=0, timeout_seconds=SYNTHESIZE_TIMEOUT_S, cache_policy=NO_CACHE)
def synthesize_task(config: PipelineConfig, model_dir: str) -> PreparedManifest:
    """Replace the prepared assistant turns with the target's own generations. Finished work is kept
    by the library, so a re-run continues; not retried here (the engine retries its own requests)."""
    logger = get_run_logger()
    report = TaskProgress(logger, "synthesize", key=run_key(config.run_dir, "synthesize-progress"), unit="samples")
    manifest = synthesize(config, RunStore(config.run_dir), Path(model_dir), report)
    logger.info(
        "synthesized %d samples (%d tokens, %d loss tokens) in %d shards",
        manifest.num_samples,
        manifest.num_tokens,
        manifest.num_loss_tokens,
        len(manifest.shards),
    )
    if report.last is None:
        report.own.create(100.0, f"{manifest.num_samples} samples, up to date (inputs unchanged)")
    return manifest
