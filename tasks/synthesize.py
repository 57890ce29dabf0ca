"""synthesize: regenerate assistant turns with the target model (eagle3.data.synthesize.synthesize)."""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from eagle3.config import PipelineConfig
from eagle3.data.synthesize import SynthesizeSummary, synthesize
from eagle3.store.run_store import PreparedManifest, RunStore
from tasks.artifacts import markdown_artifact, run_key, table_artifact
from tasks.flow_context import FlowContext
from tasks.progress import TaskProgress
from tasks.server import reap_orphan_servers

SYNTHESIZE_TIMEOUT_S = 48 * 3600  # the case study generated 10K conversations


class SynthesizeError(RuntimeError):
    """Some samples could not be generated; the others are kept, and a re-run retries exactly these."""


@task(name="synthesize", retries=1, retry_delay_seconds=30, timeout_seconds=SYNTHESIZE_TIMEOUT_S, cache_policy=NO_CACHE)
def synthesize_task(config: PipelineConfig, model_dir: str, ctx: FlowContext) -> PreparedManifest:
    """Replace the prepared assistant turns with the target's own generations. Finished samples are kept by
    the library (one checkpoint each), so a retry or a re-run generates only the missing ones. With
    `server.engine: sglang` the requests go to the run's servers: the same ones its extraction uses (a
    pipeline run opens them once in its context `ctx`, flows/pipeline.py). Samples that failed are a table artifact
    (`<run>-synthesize-failed`) and are retried by the next run; with data.on_bad_row=fail the task then fails
    (after every other sample is done and stored), with `skip` the run goes on without them."""
    logger = get_run_logger()
    report = TaskProgress(logger, "synthesize", key=run_key(config.run_dir, "synthesize-progress"), unit="samples")
    servers = None
    if config.server.engine == "sglang":
        reap_orphan_servers(config.run_dir)  # before this run's servers launch on the same ports
        servers = ctx.server_pool(config, model_dir).sglang_servers()
    try:
        result = synthesize(config, RunStore(config.run_dir), Path(model_dir), report, servers=servers)
    except Exception as e:  # the progress artifact says Failed, not its last figures
        report.fail(e)
        raise
    manifest, summary = result.manifest, result.summary
    logger.info(
        "synthesized %d samples (%d tokens, %d loss tokens) in %d shards; %s",
        manifest.num_samples,
        manifest.num_tokens,
        manifest.num_loss_tokens,
        len(manifest.shards),
        finish_line(summary),
    )
    if report.last is None:
        report.own.create(100.0, f"{manifest.num_samples} samples, up to date (inputs unchanged)")
    markdown_artifact(run_key(config.run_dir, "synthesize-summary"), summary_markdown(summary), "synthesize")
    if summary.failed:
        rows = [{"row": f.row, "sample id": f.sample_id, "reason": f.reason} for f in summary.failed]
        table_artifact(
            run_key(config.run_dir, "synthesize-failed"),
            rows,
            f"{len(rows)} of {summary.samples} samples could not be generated; a re-run (or this task's retry) "
            "generates exactly these",
        )
        first = summary.failed[0]
        if config.data.on_bad_row == "skip":
            logger.warning(
                "%d of %d samples could not be generated and are left out (data.on_bad_row=skip); first: %s (sample "
                "%s): %s. Run the pipeline again to retry exactly these",
                len(summary.failed), summary.samples, first.row, first.sample_id, first.reason,
            )  # fmt: skip
            return manifest
        raise SynthesizeError(
            f"{len(summary.failed)} of {summary.samples} samples could not be generated (the others are stored); "
            f"first: {first.row} (sample {first.sample_id}): {first.reason}. See the `"
            f"{run_key(config.run_dir, 'synthesize-failed')}` table; run the pipeline again to retry exactly them"
        )
    return manifest


def finish_line(s: SynthesizeSummary) -> str:
    turns = ", ".join(f"{n} {reason}" for reason, n in s.turns.items()) or "none"
    dropped = f", {s.dropped_truncated} dropped (synthesize.on_truncated=drop)" if s.dropped_truncated else ""
    cached = (
        f"; {s.cached_prompt_tokens} of {s.prompt_tokens} prompt tokens served by the prefix cache"
        if s.prompt_tokens
        else ""
    )
    return (
        f"turns by finish reason: {turns}; {s.truncated_samples} samples with a turn cut at max_new_tokens{dropped}; "
        f"{len(s.failed)} failed; {s.generated} generated this run, {s.tokens} tokens, {s.tokens_per_s:.1f} tok/s"
        + cached
    )


def summary_markdown(s: SynthesizeSummary) -> str:
    lines = [
        "| samples | generated this run | failed | cut at max_new_tokens | dropped | tokens | tok/s |",
        "|---|---|---|---|---|---|---|",
        f"| {s.samples} | {s.generated} | {len(s.failed)} | {s.truncated_samples} | {s.dropped_truncated} | "
        f"{s.tokens} | {s.tokens_per_s:.1f} |",
        "",
        "| finish reason | turns |",
        "|---|---|",
        *(f"| {reason} | {n} |" for reason, n in s.turns.items()),
    ]
    return "\n".join(lines)
