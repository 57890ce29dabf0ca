"""Several draft methods from one store (train.methods): each one's config, and the comparison that picks the draft
to promote, side by side in the `<run>-methods` artifact (eagle3.release.promote.choose_method)."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from eagle3.config import PipelineConfig
from eagle3.evaluate.offline import MODELLED_FORMULA
from eagle3.release.promote import choose_method
from tasks.artifacts import markdown_artifact, run_key
from tasks.evaluate import EvalSummary, modelled_text
from tasks.promote import eval_record


def with_method(config: PipelineConfig, method: str) -> PipelineConfig:
    """The run's config with train.method = `method` (its own directories, artifact keys and export)."""
    return config.model_copy(update={"train": config.train.model_copy(update={"method": method})})


def methods_markdown(evaluations: dict[str, EvalSummary], chosen: str) -> str:
    """Every (method, set, k) side by side."""
    lines = [
        "# Draft methods from one store",
        "",
        f"**candidate for promotion:** {chosen}",
        "",
        f"Modelled speed-up: {MODELLED_FORMULA}, from forward times measured in the offline evaluation "
        "(t_step: one plain decode forward of the target; t_verify: its forward over the drafted tokens; t_draft: "
        "the draft's work per round).",
        "",
        "| method | set | k | acceptance length | modelled speed-up | identical to greedy | live |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for method, s in evaluations.items():
        live = f"{s.live.speed_up:.2f}x" if s.live.status == "ok" and s.live.speed_up is not None else s.live.status
        for r in s.offline.runs or [s.offline]:
            lines.append(f"| {method} | {r.set_name} | {r.steps} | {r.acceptance_length:.3f} | {modelled_text(r)} | "
                         f"{r.identical_to_greedy}/{r.num_prompts} | {live} |")  # fmt: skip
    not_live = [f"{m}: {s.live.summary}" for m, s in evaluations.items() if s.live.status != "ok"]
    if not_live:
        lines += ["", "Not measured live:", *(f"- {t}" for t in not_live)]
    return "\n".join(lines)


@task(name="compare-methods", retries=0, timeout_seconds=120, cache_policy=NO_CACHE)
def compare_methods_task(config: PipelineConfig, evaluations: dict[str, EvalSummary]) -> tuple[str, str]:
    """(the method whose draft goes to the promotion gate, why), and the `<run>-methods` artifact."""
    records = {m: eval_record(with_method(config, m), s) for m, s in evaluations.items()}
    method, why = choose_method(records)
    get_run_logger().info("compare-methods: %s", why)
    markdown_artifact(run_key(config.run_dir, "methods"), methods_markdown(evaluations, why), why)
    return method, why
