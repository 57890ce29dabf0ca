"""prompts: the target writes a varied prompt corpus (eagle3.data.prompts.build_prompts)."""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from eagle3.config import PipelineConfig
from eagle3.data.prompts import PromptsSummary, build_prompts, corpus_path
from tasks.artifacts import markdown_artifact, run_key
from tasks.flow_context import FlowContext
from tasks.progress import TaskProgress
from tasks.server import reap_orphan_servers

PROMPTS_TIMEOUT_S = 24 * 3600


class PromptsIncomplete(RuntimeError):
    """Some requests could not be written; the others are kept, and a re-run writes exactly these."""


@task(name="prompts", retries=1, retry_delay_seconds=30, timeout_seconds=PROMPTS_TIMEOUT_S, cache_policy=NO_CACHE)
def prompts_task(config: PipelineConfig, model_dir: str, ctx: FlowContext) -> PromptsSummary:
    """Write the prompt corpus (`prompts.out_dir`/prompts.jsonl) that `data.dataset` names: requests the target
    writes from the grid, plus `prompts.include`, near-duplicates and evaluation prompts dropped. Each written
    request is kept (one file each), so a retry or a re-run writes only the missing ones. With `server.engine:
    sglang` the requests go to the servers of the flow run's context `ctx` (the ones synthesize and extract use)."""
    logger = get_run_logger()
    report = TaskProgress(logger, "prompts", key=run_key(config.run_dir, "prompts-progress"), unit="requests")
    servers = None
    if config.server.engine == "sglang":
        reap_orphan_servers(config.run_dir)
        servers = ctx.server_pool(config, model_dir).sglang_servers()
    with report:  # the artifact at once, and a heartbeat while the model loads
        summary = build_prompts(config, Path(model_dir), report, servers=servers)
    logger.info("%s", summary_line(summary, corpus_path(config)))
    if report.last is None:
        report.own.create(100.0, f"{summary.prompts} prompts, up to date")
    markdown_artifact(run_key(config.run_dir, "prompts-summary"), summary_markdown(summary), "prompts")
    if summary.failed:
        message = (
            f"{len(summary.failed)} of {summary.cells} requests could not be written (the others are stored); "
            f"first: {summary.failed[0]}. Run the pipeline again to write exactly these"
        )
        if config.data.on_bad_row == "fail":
            raise PromptsIncomplete(message)
        logger.warning("%s (data.on_bad_row=skip: the corpus goes on without them)", message)
    return summary


def summary_line(s: PromptsSummary, path: Path) -> str:
    return (
        f"{s.prompts} prompts in {path}: {s.cells} grid cells ({s.generated} written this run, {len(s.failed)} "
        f"failed, {s.too_short} too short), {s.included} included; dropped {s.near_eval} near an evaluation "
        f"prompt and {s.near_duplicates} near-duplicates"
    )


def summary_markdown(s: PromptsSummary) -> str:
    lines = [
        "| grid cells | written this run | failed | too short | included | near evaluation | near-duplicates | "
        "prompts |",
        "|---|---|---|---|---|---|---|---|",
        f"| {s.cells} | {s.generated} | {len(s.failed)} | {s.too_short} | {s.included} | {s.near_eval} | "
        f"{s.near_duplicates} | {s.prompts} |",
    ]
    if s.examples_dropped:
        lines += ["", "Dropped, for example:", *(f"- {e}" for e in s.examples_dropped)]
    return "\n".join(lines)
