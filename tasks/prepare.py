"""prepare: conversations -> token ids + loss masks -> prepared shards (eagle3.data.prepare.prepare)."""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from eagle3.config import PipelineConfig
from eagle3.data.prepare import prepare
from eagle3.store.run_store import PreparedManifest, RunStore
from tasks.artifacts import run_key
from tasks.progress import TaskProgress

PREPARE_TIMEOUT_S = 6 * 3600  # tokenizing ~1M conversations on a few cores
SHOW_BAD_ROWS = 5


@task(name="prepare", retries=0, timeout_seconds=PREPARE_TIMEOUT_S, cache_policy=NO_CACHE)
def prepare_task(config: PipelineConfig, model_dir: str) -> PreparedManifest:
    """Tokenize `data.dataset` into `<run_dir>/prepared/` (a no-op when its inputs are unchanged).
    Deterministic, so never retried: a bad input fails the same way twice."""
    logger = get_run_logger()
    report = TaskProgress(logger, "prepare", key=run_key(config.run_dir, "prepare-progress"), unit="rows")
    store = RunStore(config.run_dir)
    before = store.read_prepared_manifest()
    source_before = store.synthesis_source().read_prepared_manifest()
    with report:
        manifest = prepare(config, store, Path(model_dir), report)
    # with synthesize owning prepared/, the source grows in synthesized/source/ (eagle3.data.prepare.prepare)
    source_only = before is not None and before.synthesis is not None and manifest.synthesis is None
    where = store.synthesis_source() if source_only else store
    before = source_before if source_only else before
    logger.info(
        "prepared %d samples (%d tokens, %d loss tokens) in %d shards under %s; %d bad rows, %d duplicates",
        manifest.num_samples,
        manifest.num_tokens,
        manifest.num_loss_tokens,
        len(manifest.shards),
        where.prepared_dir,
        len(manifest.bad_rows),
        manifest.duplicates,
    )
    if len(manifest.intakes) > len(before.intakes if before else []):  # this run took files in (eagle3.data.prepare)
        i = manifest.intakes[-1]
        logger.info(
            "intake %d: %d new samples (%d tokens) in shards %s from %d new or changed files; %d rows already in "
            "the store", len(manifest.intakes), i.new_samples, i.new_tokens, i.shards, len(i.files), i.known_samples,
        )  # fmt: skip
        if i.missing_files or i.vanished_samples:
            logger.warning(
                "intake %d: %d source files gone (%s), %d samples whose source row is gone; kept in the store",
                len(manifest.intakes), len(i.missing_files), ", ".join(i.missing_files[:3]), i.vanished_samples,
            )  # fmt: skip
    for bad in manifest.bad_rows[:SHOW_BAD_ROWS]:
        logger.warning("bad row %s:%d: %s", bad.file, bad.row, bad.reason)
    if len(manifest.bad_rows) > SHOW_BAD_ROWS:
        logger.warning("... %d more bad rows in prepared/manifest.json", len(manifest.bad_rows) - SHOW_BAD_ROWS)
    if report.last is None:  # unchanged inputs: the library returned the existing manifest at once
        report.own.create(100.0, f"{manifest.num_samples} samples, up to date (inputs unchanged)")
    return manifest
