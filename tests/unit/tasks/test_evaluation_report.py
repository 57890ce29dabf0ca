"""The evaluation's verdict: a live speed-up below 1.0 is flagged in the artifact and fails the flow run (unless
evaluate.fail_on_slowdown is off, when it is still flagged); the numbers in the artifact are the results' own.
Results are built by hand (no model runs here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eagle3.config import PipelineConfig
from eagle3.evaluate.live import LiveEvalResult, ServerRun
from eagle3.evaluate.offline import (
    CategoryStats,
    EvalPrompts,
    OfflineEvalResult,
    PositionStats,
    SkippedSet,
    write_offline_result,
)
from eagle3.store.run_store import RunInfo, RunStore
from tasks.evaluate import EvalSummary, evaluation_markdown, evaluation_outcome, previous_offline


def offline() -> OfflineEvalResult:
    return OfflineEvalResult(
        model_dir="m", checkpoint="c", aux_layers=[2, 15, 27], steps=3, max_new_tokens=32, device="cuda:0",
        dtype="bfloat16", torch_threads=1, num_prompts=4, rounds=40, accepted_tokens=52, generated_tokens=92,
        acceptance_length=2.3, tokens_per_verify=2.3, accepted_histogram=[10, 10, 12, 8],
        positions=[PositionStats(position=1, reached=40, accepted=30, rate=0.75),
                   PositionStats(position=2, reached=30, accepted=20, rate=2 / 3),
                   PositionStats(position=3, reached=20, accepted=8, rate=0.4)],
        identical_to_greedy=4, mismatched_prompts=[], greedy_tokens_per_s=100.0, speculative_tokens_per_s=150.0,
        speedup=1.5, greedy_s=1.0, speculative_s=0.7, elapsed_s=2.0, per_prompt=[],
    )  # fmt: skip


def stored_run(root: Path) -> Path:
    """A run directory's run.json and a checkpoint (resolve_checkpoint: a directory holding model.safetensors)."""
    ckpt = root / "train"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(b"w")
    RunStore(root).write_run_info(
        RunInfo(model_path="m", model_sha256="s", tokenizer_sha256="t", engine="transformers", engine_version="0",
                dtype="bfloat16", hidden_size=8, num_layers=4, vocab_size=32, aux_layers=[1, 2, 3],
                engine_layer_ids=[1, 2, 3], engine_layer_convention="hf_hidden_states", dataset_fingerprint="d",
                versions={}, config={})
    )  # fmt: skip
    return ckpt


def live(speed_up: float) -> LiveEvalResult:
    def run(label: str, tps: float) -> ServerRun:
        return ServerRun.model_validate(
            {"label": label, "completion_tokens": 100, "seconds": 100 / tps, "tokens_per_s": tps, "prompts": []}
        )

    flag = speed_up < 1.0
    return LiveEvalResult(
        status="ok", device="cuda", draft_dir="d", model_dir="m", num_prompts=4, max_new_tokens=32,
        speculative={"num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}, plain=run("plain", 100.0),
        eagle3=run("eagle3", 100.0 * speed_up), speed_up=speed_up, accept_length=1.4, flag=flag,
        summary=("FLAGGED: the draft makes serving SLOWER. " if flag else "") + f"{speed_up:.2f}x",
    )  # fmt: skip


def test_a_draft_slower_than_the_plain_server_is_flagged_and_fails_the_run() -> None:
    summary = EvalSummary(offline=offline(), live=live(0.66))
    text = evaluation_markdown(PipelineConfig(), summary)
    assert text.startswith("> **FLAGGED") and "| live (SGLang, cuda) | 1.400 | | 0.66x |" in text
    state = evaluation_outcome(PipelineConfig(), summary)
    assert state is not None and state.is_failed() and "slower" in (state.message or "")


def test_with_fail_on_slowdown_off_a_slower_draft_is_still_flagged_but_the_run_does_not_fail() -> None:
    cfg = PipelineConfig.model_validate({"evaluate": {"fail_on_slowdown": False}})
    summary = EvalSummary(offline=offline(), live=live(0.66))
    text = evaluation_markdown(cfg, summary)
    assert text.startswith("> **FLAGGED") and "evaluate.fail_on_slowdown is off" in text
    assert evaluation_outcome(cfg, summary) is None


def test_an_output_changed_beyond_a_near_tie_is_listed_and_fails_the_run_with_its_own_advice() -> None:
    from eagle3.evaluate.live import OutputDifference
    from tasks.failure import advice

    diffs = [
        OutputDifference(prompt=1, position=5, plain_token=6, eagle3_token=7, top2=[(6, -0.5), (7, -0.6)], gap=0.1,
                         near_tie=True),
        OutputDifference(prompt=3, position=2, plain_token=8, eagle3_token=2, top2=[(8, -0.1), (9, -3.0)], gap=2.9,
                         near_tie=False),
    ]  # fmt: skip
    changed = live(1.8).model_copy(update={"differences": diffs, "unexplained": 1, "summary": "OUTPUTS CHANGED: x"})
    summary = EvalSummary(offline=offline(), live=changed)
    text = evaluation_markdown(PipelineConfig(), summary)
    assert "| 1 | 5 | 6 | 7 | 6: -0.500, 7: -0.600 | 0.100 | yes |" in text
    assert "| 3 | 2 | 8 | 2 | 8: -0.100, 9: -3.000 | 2.900 | **no** |" in text
    state = evaluation_outcome(PipelineConfig(), summary)
    assert state is not None and state.is_failed() and "changed the target's greedy output" in (state.message or "")
    assert "a serving bug" in advice(None, state.data, "data/runs/x")  # type: ignore[arg-type]
    near_ties_only = changed.model_copy(update={"unexplained": 0})
    assert evaluation_outcome(PipelineConfig(), EvalSummary(offline=offline(), live=near_ties_only)) is None


def test_a_faster_draft_passes_and_the_table_carries_its_numbers() -> None:
    summary = EvalSummary(offline=offline(), live=live(1.8))
    text = evaluation_markdown(PipelineConfig(), summary)
    assert "FLAGGED" not in text and evaluation_outcome(PipelineConfig(), summary) is None
    assert "| offline | 2.300 | 0.75, 0.67, 0.40 | 1.50x |" in text and "| 1.80x |" in text
    assert "180.0 tokens/s with the draft, 100.0 without" in text


def test_a_stored_offline_result_is_reused_only_for_the_same_checkpoint_settings_and_target_dtype(
    tmp_path: Path,
) -> None:
    ckpt = stored_run(tmp_path)
    one = offline().model_copy(update={"checkpoint": str(ckpt), "dtype": "float32"})
    write_offline_result(tmp_path, one.model_copy(update={"runs": [one, one.model_copy(update={"steps": 5})]}))
    cpu: dict[str, Any] = {"run_dir": str(tmp_path)}
    ev: dict[str, Any] = {"device": "cpu", "max_new_tokens": 32}
    same = PipelineConfig.model_validate({**cpu, "evaluate": ev})

    def held_out(n: int, name: str = "held-out") -> list[EvalPrompts]:
        return [EvalPrompts(name, "held-out", "d.jsonl", [[1]] * n, [None] * n)]

    assert previous_offline(same, held_out(4)) is not None  # offline_dtype auto on CPU = float32, as measured
    bf16 = PipelineConfig.model_validate({**cpu, "evaluate": {**ev, "offline_dtype": "bfloat16"}})
    assert previous_offline(bf16, held_out(4)) is None
    assert previous_offline(same, held_out(5)) is None
    assert previous_offline(same, held_out(4, "varied")) is None  # another set
    only_k3 = PipelineConfig.model_validate({**cpu, "evaluate": {**ev, "compare_steps": [3]}})
    assert previous_offline(only_k3, held_out(4)) is None  # other chain lengths


def test_the_artifact_shows_every_set_at_every_chain_length_side_by_side_with_categories() -> None:
    base = offline()
    cat = CategoryStats(category="maths", num_prompts=2, rounds=10, accepted_tokens=5, acceptance_length=1.5,
                        positions=[PositionStats(position=1, reached=10, accepted=5, rate=0.5)])  # fmt: skip
    runs = [
        base.model_copy(update={"set_name": "varied", "set_kind": "varied hand-written", "categories": [cat]}),
        base.model_copy(update={"set_name": "varied", "set_kind": "varied hand-written", "steps": 5,
                                "acceptance_length": 2.5}),
        base.model_copy(update={"set_name": "humaneval", "set_kind": "public", "acceptance_length": 1.7}),
    ]  # fmt: skip
    text = evaluation_markdown(PipelineConfig(), EvalSummary(offline=runs[0].model_copy(update={"runs": runs}),
                                                             live=live(1.8)))  # fmt: skip
    assert "| varied | varied hand-written | 4 | 3 | 2.300 | 0.75, 0.67, 0.40 | - | 4/4 |" in text  # no modelled
    assert "| varied | varied hand-written | 4 | 5 | 2.500 |" in text
    assert "| humaneval | public | 4 | 3 | 1.700 |" in text
    assert "| varied | 3 | maths | 2 | 1.500 | 0.50 |" in text


def test_a_skipped_set_is_listed_with_its_reason_and_left_out_of_the_reuse_check(tmp_path: Path) -> None:
    """A set not evaluated with this target (a tool-call set on a template without tools) is named in the artifact
    with its reason; a stored result still matches the sets that were evaluated."""
    reason = "data/eval_tool_calls.jsonl row 1 carries tools and the target's chat template has no tool support"
    skipped = SkippedSet(name="tool-calls", kind="agentic (tool calls)", dataset="d", reason=reason)
    base = offline()
    off = base.model_copy(update={"runs": [base], "skipped": [skipped]})
    text = evaluation_markdown(PipelineConfig(), EvalSummary(offline=off, live=live(1.8)))
    assert f"- `tool-calls` (agentic (tool calls)): {reason}" in text

    ckpt = stored_run(tmp_path)
    one = base.model_copy(update={"checkpoint": str(ckpt), "dtype": "float32"})
    write_offline_result(tmp_path, one.model_copy(update={"runs": [one], "skipped": [skipped]}))
    cfg = PipelineConfig.model_validate({"run_dir": str(tmp_path), "evaluate": {"device": "cpu", "max_new_tokens": 32,
                                                                                "compare_steps": [3]}})  # fmt: skip
    sets = [EvalPrompts("held-out", "held-out", "d.jsonl", [[1]] * 4, [None] * 4),
            EvalPrompts("tool-calls", "agentic (tool calls)", "d", [], [], skipped=reason)]  # fmt: skip
    assert previous_offline(cfg, sets) is not None
