"""evaluate: offline acceptance (transformers target, exact greedy) and, where the SGLang environment exists, the
live speed against the plain server. A live speed-up below 1.0 is flagged, and fails the flow run unless
evaluate.fail_on_slowdown is off: such a draft slows serving down."""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.states import Failed, State
from pydantic import BaseModel

from eagle3.config import PipelineConfig
from eagle3.data.chat import ChatTokenizer
from eagle3.draft.checkpoint import resolve_checkpoint
from eagle3.evaluate.live import LiveEvalResult, evaluate_live, read_live_result
from eagle3.evaluate.offline import (
    MODELLED_FORMULA,
    EvalPrompts,
    OfflineEvalResult,
    PositionStats,
    context_buckets,
    evaluate_offline,
    evaluated,
    load_eval_sets,
    offline_dtype,
    read_offline_result,
)
from eagle3.evaluate.sizes import sized_here
from eagle3.release.export import default_export_dir
from eagle3.store.paths import RunPaths
from eagle3.store.run_store import RunStore
from tasks.artifacts import markdown_artifact, method_key
from tasks.progress import TaskProgress
from tasks.server import reap_orphan_servers, server_env

EVALUATE_TIMEOUT_S = 6 * 3600
NOT_FAILING = "(the run does not fail: evaluate.fail_on_slowdown is off)"


class DraftSlowerError(RuntimeError):
    """The live evaluation found the draft slower than the plain server (evaluate.fail_on_slowdown on)."""


class OutputsChangedError(RuntimeError):
    """Served with the draft, the target's greedy output changed beyond a near-tie (or at all, float32 on CPU)."""


class EvalSummary(BaseModel):
    offline: OfflineEvalResult
    live: LiveEvalResult

    @property
    def flagged(self) -> bool:
        return self.live.flag


def rates_text(positions: list[PositionStats]) -> str:
    return ", ".join(f"{p.rate:.2f}" if p.rate is not None else "-" for p in positions)


def modelled_text(r: OfflineEvalResult) -> str:
    m = r.modelled
    if m is None:
        return "-"
    return (f"{m.speedup:.2f}x (t_step {1e3 * m.target_step_s:.1f} ms, t_verify {1e3 * m.verify_s:.1f} ms, "
            f"t_draft {1e3 * m.draft_s:.1f} ms)")  # fmt: skip


def sets_table(off: OfflineEvalResult) -> list[str]:
    """Every evaluation set at every chain length, side by side, then per category where a set has them."""
    lines = [
        "| set | kind | prompts | k | acceptance length | per position | modelled speed-up | identical to greedy |",
        "|---|---|---:|---:|---:|---|---:|---:|",
    ]
    for r in off.runs or [off]:
        lines.append(f"| {r.set_name} | {r.set_kind} | {r.num_prompts} | {r.steps} | {r.acceptance_length:.3f} | "
                     f"{rates_text(r.positions)} | {modelled_text(r)} | "
                     f"{r.identical_to_greedy}/{r.num_prompts} |")  # fmt: skip
    lines += ["", "By context length (prompt tokens; rounds pooled within a bucket):", "",
              "| set | k | context | prompts | acceptance length |", "|---|---:|---|---:|---:|"]  # fmt: skip
    for r in off.runs or [off]:
        lines += [f"| {r.set_name} | {r.steps} | {b.label} | {b.num_prompts} | {b.acceptance_length:.3f} |"
                  for b in context_buckets(r.per_prompt)]  # fmt: skip
    if off.skipped:
        lines += ["", "Not evaluated with this target:", ""]
        lines += [f"- `{s.name}` ({s.kind}): {s.reason}" for s in off.skipped]
    with_categories = [r for r in off.runs if r.categories]
    if with_categories:
        lines += ["", "| set | k | category | prompts | acceptance length | per position |"]
        lines += ["|---|---:|---|---:|---:|---|"]
        for r in with_categories:
            lines += [f"| {r.set_name} | {r.steps} | {c.category} | {c.num_prompts} | {c.acceptance_length:.3f} | "
                      f"{rates_text(c.positions)} |" for c in r.categories]  # fmt: skip
    return lines


def evaluation_markdown(config: PipelineConfig, s: EvalSummary) -> str:
    off, live = s.offline, s.live
    measured = live.eagle3 if live.status == "ok" and live.plain is not None else None
    method = config.train.method
    lines = [
        f"## Evaluation of the {method} draft",
        "",
        f"`{default_export_dir(Path(config.run_dir), method).resolve()}`: {off.max_new_tokens} new tokens, greedy; "
        "offline acceptance length = tokens per verify round (accepted drafts + 1), per set and chain length k; "
        f"modelled speed-up: {MODELLED_FORMULA} (ModelledSpeedup, from forward times measured here).",
        "",
        *sets_table(off),
        "",
        f"| first set (`{off.set_name}`, k={off.steps}) | acceptance length | per position | speed-up |",
        "|---|---:|---|---:|",
        f"| offline | {off.acceptance_length:.3f} | {rates_text(off.positions)} | {off.speedup:.2f}x |",
    ]
    if measured is not None:
        lines.append(f"| live (SGLang, {live.device}) | {live.accept_length or 0:.3f} | | {live.speed_up or 0:.2f}x |")
    lines += [
        "",
        f"Offline ({off.label}): {off.speculative_tokens_per_s:.1f} tokens/s with the draft, "
        f"{off.greedy_tokens_per_s:.1f} without; the target in {off.dtype}.",
    ]
    if measured is not None and live.plain is not None:
        lines.append(
            f"Live: {measured.tokens_per_s:.1f} tokens/s with the draft, {live.plain.tokens_per_s:.1f} without."
        )
    lines += ["", f"**Live:** {live.summary}" if live.status == "ok" else f"Live: {live.summary}"]
    if live.differences:
        lines += ["", "| prompt | first differing position | plain token | EAGLE3 token | top-2 (id: logprob) | gap | "
                  "near-tie |", "|---:|---:|---:|---:|---|---:|---|"]  # fmt: skip
        lines += [f"| {d.prompt} | {d.position} | {d.plain_token} | {d.eagle3_token} | "
                  f"{', '.join(f'{t}: {lp:.3f}' for t, lp in d.top2)} | {'' if d.gap is None else f'{d.gap:.3f}'} | "
                  f"{'yes' if d.near_tie else '**no**'} |" for d in live.differences]  # fmt: skip
    if off.identical_to_greedy != off.num_prompts:
        lines.append(f"\nOffline outputs differing from plain greedy decoding: prompts {off.mismatched_prompts}.")
    if s.flagged:
        note = "" if config.evaluate.fail_on_slowdown else f" {NOT_FAILING}"
        lines.insert(
            0, f"> **FLAGGED: this draft makes serving slower than the plain target. Do not deploy it.**{note}\n"
        )
    return "\n".join(lines)


def previous_offline(config: PipelineConfig, sets: list[EvalPrompts]) -> OfflineEvalResult | None:
    """eval/offline.json when it measured this checkpoint with these settings, sets (names, sizes) and chain lengths
    included, target dtype too (a re-run does no work)."""
    store, ev, method = RunStore(config.run_dir), config.evaluate, config.train.method
    old = read_offline_result(store.root, method)  # None for an older format too: measured again
    if old is None:
        return None
    info = store.require_run_info("evaluate needs the store the draft was trained from")
    dtype = offline_dtype(ev, info.dtype)
    ks = ev.chain_lengths()
    want = [(s.name, len(s.ids), k) for s in evaluated(sets) for k in ks]
    have = [(r.set_name, r.num_prompts, r.steps) for r in old.runs]
    now = (str(resolve_checkpoint(store.method(method).train.root)), ev.max_new_tokens, dtype, want)
    return old if (old.checkpoint, old.max_new_tokens, old.dtype, have) == now else None


def previous_live(config: PipelineConfig, num_prompts: int) -> LiveEvalResult | None:
    """eval/live.json when it measured the current export with these settings."""
    store, ev, method = RunStore(config.run_dir), config.evaluate, config.train.method
    path, export = store.method(method).live_eval_json, store.method(method).latest_export_json
    if not path.is_file() or not export.is_file() or path.stat().st_mtime < export.stat().st_mtime:
        return None
    old = read_live_result(store.root, method)
    if old is None:
        return None
    same = (old.status, old.num_prompts, old.max_new_tokens) == ("ok", num_prompts, ev.max_new_tokens)
    classified = old.unexplained is not None or not old.mismatched_prompts  # one from before the classification: again
    return old if same and classified else None


@task(name="evaluate", retries=0, timeout_seconds=EVALUATE_TIMEOUT_S, cache_policy=NO_CACHE)
def evaluate_task(config: PipelineConfig, model_dir: str) -> EvalSummary:
    """Held-out prompts -> offline acceptance (eval/offline.json) and live speed (eval/live.json)."""
    logger = get_run_logger()
    config = config.model_copy(update={"evaluate": sized_here(config.evaluate)})  # the size on this worker
    run_dir, model, method = Path(config.run_dir), Path(model_dir), config.train.method
    paths, ev = RunPaths(run_dir).method(method), config.evaluate
    sets = load_eval_sets(ev, ChatTokenizer.from_model_dir(model, config.data))
    for s in sets:
        if s.skipped:
            logger.warning("evaluate: set %s (%s) not evaluated: %s", s.name, s.kind, s.skipped)
    prompts = evaluated(sets)[0].ids  # the live evaluation's prompts: the first evaluated set's
    key = method_key(config.run_dir, method, "evaluate-progress")
    report = TaskProgress(logger, "evaluate", key=key, unit="prompts")
    offline = previous_offline(config, sets)
    if offline is None:
        with report:
            offline = evaluate_offline(
                ev, run_dir, model, paths.train.root, sets=sets, progress=report, out=paths.offline_eval_json
            )
    else:
        logger.info("evaluate: %s already measures this checkpoint; not evaluated again", paths.offline_eval_json)
    for r in offline.runs:
        logger.info("evaluate: set %s (%s, %d prompts): offline acceptance length %.3f (k=%d)",
                    r.set_name, r.set_kind, r.num_prompts, r.acceptance_length, r.steps)  # fmt: skip
    live = previous_live(config, len(prompts))
    if live is None:
        reap_orphan_servers(config.run_dir)  # the servers of a killed earlier evaluation, before ours launch
        live_report = TaskProgress(
            logger, "evaluate-live", key=method_key(config.run_dir, method, "evaluate-live-progress"), unit="requests"
        )
        with live_report:  # launching two SGLang servers is minutes of silence otherwise
            live = evaluate_live(
                prompts, draft_dir=default_export_dir(run_dir, method), model_dir=model, run_dir=run_dir,
                server=config.server, evaluate=ev, base_env=server_env(), progress=live_report, method=method,
            )  # fmt: skip
    goes_on = f" {NOT_FAILING}" if live.flag and not ev.fail_on_slowdown else ""
    (logger.error if live.flag or live.unexplained else logger.info)("evaluate: %s%s", live.summary, goes_on)
    summary = EvalSummary(offline=offline, live=live)
    markdown_artifact(
        method_key(config.run_dir, method, "evaluation"),
        evaluation_markdown(config, summary),
        ", ".join(f"{r.set_name} k={r.steps} {r.acceptance_length:.2f}" for r in offline.runs or [offline])
        + " offline acceptance"
        + (" - FLAGGED" if live.flag else ""),
    )
    return summary


def evaluation_outcome(config: PipelineConfig, summary: EvalSummary | None) -> State | None:
    """Failed (the flow run's final state) when speculation changed a greedy output beyond a near-tie, or when the
    live speed-up is below 1.0 and evaluate.fail_on_slowdown is on; else None."""
    if summary is not None and summary.live.unexplained:
        message = f"speculation changed the target's greedy output: {summary.live.summary}"
        return Failed(message=message, data=OutputsChangedError(message))
    if summary is not None and summary.flagged and config.evaluate.fail_on_slowdown:
        message = f"the draft makes serving slower: {summary.live.summary}"
        return Failed(message=message, data=DraftSlowerError(message))
    return None
