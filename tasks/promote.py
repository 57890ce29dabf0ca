"""promote: move `<run_dir>/draft/current` to the draft just evaluated when it is not worse than the current one
(eagle3.release.promote.promote); event `eagle3.draft.promoted` or `eagle3.draft.kept`, and the reason in an
artifact."""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from eagle3.config import PipelineConfig
from eagle3.data.eval_sets import dataset_sha256
from eagle3.evaluate.offline import OfflineEvalResult
from eagle3.release.promote import Decision, EvalRecord, EvalSet, SetRecord, latest_link, pointed, promote
from tasks.artifacts import markdown_artifact, run_key
from tasks.evaluate import EvalSummary
from tasks.events import emit_run_event
from tasks.export import serve_command

PROMOTE_TIMEOUT_S = 5 * 60  # hashes the evaluation set, writes two small files and a symlink


def eval_record(config: PipelineConfig, s: EvalSummary) -> EvalRecord:
    off, live = s.offline, s.live
    live_ok = live.status == "ok" and live.speed_up is not None
    hashes = {c.name: dataset_sha256(c) for c in config.evaluate.eval_sets()}

    def eval_set(r: OfflineEvalResult) -> EvalSet:
        return EvalSet(dataset_sha256=hashes.get(r.set_name, ""), num_prompts=r.num_prompts,
                       max_new_tokens=r.max_new_tokens, draft_steps=r.steps, offline_dtype=r.dtype)  # fmt: skip

    return EvalRecord(
        method=config.train.method,
        eval_set=eval_set(off),
        acceptance_length=off.acceptance_length,
        modelled_speed_up=off.modelled.speedup if off.modelled is not None else None,
        sets=[
            SetRecord(name=r.set_name, eval_set=eval_set(r), acceptance_length=r.acceptance_length) for r in off.runs
        ],
        live_speed_up=live.speed_up if live_ok else None,
        live_device=live.device if live_ok else None,
        flagged=live.flag,
    )


def promotion_markdown(config: PipelineConfig, model_dir: str, d: Decision) -> str:
    head = "Promoted" if d.promoted else "Kept the current draft"
    new, old = d.candidate_eval, d.previous_eval
    lines = [
        f"# {head}",
        "",
        *([f"**candidate:** {d.chosen}", ""] if d.chosen else []),
        f"**{'promoted' if d.promoted else 'kept'}:** {d.reason}",
        "",
        "| | method | offline acceptance length | modelled speed-up | live speed-up |",
        "|---|---|---:|---:|---:|",
        f"| new `{Path(d.candidate).name}` | {new.method} | {new.acceptance_length:.3f} | "
        f"{fmt_speed(new.modelled_speed_up)} | {fmt_speed(new.live_speed_up)} |",
    ]
    if old is not None and d.previous is not None:
        lines.append(f"| current before `{Path(d.previous).name}` | {old.method} | {old.acceptance_length:.3f} | "
                     f"{fmt_speed(old.modelled_speed_up)} | {fmt_speed(old.live_speed_up)} |")  # fmt: skip
    lines += [
        "",
        f"`draft/current` -> `{d.current}`" if d.current else "There is no promoted draft yet.",
        "",
        "Serve the promoted draft:",
        "",
        f"```\n{serve_command(model_dir, config.run_dir, config.evaluate.draft_steps)}\n```",
    ]
    return "\n".join(lines)


def fmt_speed(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


@task(name="promote", retries=0, timeout_seconds=PROMOTE_TIMEOUT_S, cache_policy=NO_CACHE)
def promote_task(config: PipelineConfig, model_dir: str, evaluation: EvalSummary, chosen: str = "") -> Decision:
    """Record the evaluation beside the export train.method's `latest` points at, and move `draft/current` to it
    when evaluate.promote allows; emits `eagle3.draft.promoted` or `eagle3.draft.kept` with the reason (and
    `chosen`: why this method's draft is the candidate, when several were trained)."""
    run_dir = Path(config.run_dir)
    latest = latest_link(run_dir, config.train.method)
    candidate = pointed(latest)
    if candidate is None:
        raise FileNotFoundError(f"{latest}: no export to promote; run the export stage first")
    ev = config.evaluate
    decision = promote(
        run_dir,
        candidate,
        eval_record(config, evaluation),
        policy=ev.promote,
        tolerance=ev.promote_tolerance,
        block_flagged=ev.fail_on_slowdown,
        chosen=chosen,
    )
    get_run_logger().info("promote: %s (%s)", "promoted" if decision.promoted else "kept", decision.reason)
    event = "eagle3.draft.promoted" if decision.promoted else "eagle3.draft.kept"
    emit_run_event(config.run_dir, event, decision.model_dump(mode="json"))
    markdown_artifact(
        run_key(config.run_dir, "promotion"),
        promotion_markdown(config, model_dir, decision),
        ("promoted: " if decision.promoted else "kept: ") + decision.reason,
    )
    return decision
