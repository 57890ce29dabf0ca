"""export: the trained draft as a directory SGLang serves (and a speculators copy), eagle3.export.export_draft."""

from __future__ import annotations

import time
from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from eagle3.config import PipelineConfig
from eagle3.export import ExportResult, default_export_dir, export_draft
from eagle3.progress import Progress
from tasks.artifacts import TaskProgress, markdown_artifact, run_key

EXPORT_TIMEOUT_S = 30 * 60  # reads and writes the draft's weights (a few GB for an 8B target's draft)


@task(name="export", retries=0, timeout_seconds=EXPORT_TIMEOUT_S, cache_policy=NO_CACHE)
def export_task(config: PipelineConfig, model_dir: str) -> ExportResult:
    """`<run_dir>/draft/` from the latest checkpoint of `<run_dir>/train/`; unchanged inputs: no work."""
    logger = get_run_logger()
    out = default_export_dir(Path(config.run_dir))
    start = time.monotonic()
    with TaskProgress(logger, "export", key=run_key(config.run_dir, "export-progress"), unit="drafts") as report:
        result = export_draft(
            Path(config.run_dir) / "train",
            Path(config.run_dir),
            Path(model_dir),
            out,
            speculative_tokens=config.evaluate.draft_steps,
        )
        report(Progress("export", 1, 1, 0, time.monotonic() - start))
    logger.info("export: %s %s (step %s)", "unchanged" if result.skipped else "wrote", out, result.checkpoint_step)
    for note in result.notes:
        logger.warning("export: %s", note)
    serve = " ".join(["python -m sglang.launch_server", *result.sglang_args])  # the args name the target too
    markdown_artifact(
        run_key(config.run_dir, "export"),
        "\n".join(
            [
                f"# Draft `{Path(result.out_dir).resolve()}`",
                "",
                f"- from checkpoint `{result.checkpoint}` (step {result.checkpoint_step})",
                f"- {result.num_parameters:,} trainable parameters, draft vocabulary {result.draft_vocab_size} of "
                f"{result.target_vocab_size}, aux layers {result.aux_layers} (SGLang ids {result.sglang_layer_ids})",
                "",
                "Serve it:",
                "",
                f"```\n{serve}\n```",
                *(f"\n> {n}" for n in result.notes),
            ]
        ),
        f"EAGLE-3 draft exported from step {result.checkpoint_step}",
    )
    return result
