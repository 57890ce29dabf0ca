"""export: the trained draft as a directory SGLang serves (and a speculators copy), eagle3.release.export.export_draft.
Each checkpoint gets its own directory under `<run_dir>/draft/exports/`; `draft/latest` points at it, and
`draft/current` (what to serve) moves only on promotion (tasks/promote.py)."""

from __future__ import annotations

import time
from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from eagle3.config import PipelineConfig
from eagle3.progress import Progress
from eagle3.release.export import ExportResult, export_draft, read_export, sglang_args
from eagle3.release.promote import current_link, export_dir_for, latest_link, point
from eagle3.store.paths import RunPaths
from tasks.artifacts import markdown_artifact, method_key
from tasks.progress import TaskProgress

EXPORT_TIMEOUT_S = 30 * 60  # reads and writes the draft's weights (a few GB for an 8B target's draft)


def serve_command(model_dir: str, run_dir: str, steps: int) -> str:
    """The command that serves the promoted draft through the stable `draft/current` path, with its method's flags
    (its export.json's; EAGLE-3's chain of `steps` before there is a promoted draft)."""
    current = current_link(Path(run_dir)).absolute()
    export = read_export(current) if current.is_dir() else None
    if export is None:
        args = sglang_args(Path(model_dir).resolve(), current, steps=steps)
    else:
        args = list(export.sglang_args)
        args[args.index("--speculative-draft-model-path") + 1] = str(current)
    return " ".join(["python -m sglang.launch_server", *args])


@task(name="export", retries=0, timeout_seconds=EXPORT_TIMEOUT_S, cache_policy=NO_CACHE)
def export_task(config: PipelineConfig, model_dir: str) -> ExportResult:
    """`<run_dir>/draft/exports/<checkpoint>-<sha>/` from the trained draft of `<run_dir>/train/` (its best
    checkpoint with train.select: best, else its latest), and `draft/latest` pointed at it; the same checkpoint
    again: no work. A method other than EAGLE-3 (train.method) has these under `draft/<method>/`."""
    logger = get_run_logger()
    method = config.train.method
    run_dir, train_dir = Path(config.run_dir), RunPaths(config.run_dir).method(method).train.root
    out, latest = export_dir_for(run_dir, train_dir, method), latest_link(run_dir, method)
    start = time.monotonic()
    key = method_key(config.run_dir, method, "export-progress")
    with TaskProgress(logger, "export", key=key, unit="drafts", tokens=False) as report:
        result = export_draft(train_dir, run_dir, Path(model_dir), out, speculative_tokens=config.evaluate.draft_steps)
        report(Progress("export", 1, 1, 0, time.monotonic() - start))
    point(latest, out)
    logger.info("export: %s %s (step %s)", "unchanged" if result.skipped else "wrote", out, result.checkpoint_step)
    for note in result.notes:
        logger.warning("export: %s", note)
    markdown_artifact(
        method_key(config.run_dir, method, "export"),
        "\n".join(
            [
                f"# {method} draft `{Path(result.out_dir).resolve()}`",
                "",
                f"- from checkpoint `{result.checkpoint}` (step {result.checkpoint_step})",
                f"- {result.num_parameters:,} trainable parameters, draft vocabulary {result.draft_vocab_size} of "
                f"{result.target_vocab_size}, aux layers {result.aux_layers} (SGLang ids {result.sglang_layer_ids})",
                f"- `{latest}` points at it; `{current_link(run_dir)}` moves to it only when its "
                "evaluation is not worse than the current draft's (the promotion artifact says which)",
                "",
                "Serve the promoted draft:",
                "",
                f"```\n{serve_command(model_dir, config.run_dir, config.evaluate.draft_steps)}\n```",
                *(f"\n> {n}" for n in result.notes),
            ]
        ),
        f"{method} draft exported from step {result.checkpoint_step}",
    )
    return result
