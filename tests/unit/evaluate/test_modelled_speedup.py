"""The modelled speed-up: tau tokens per round at the cost of one verify forward and one round of drafting,
against one token per plain decode forward, from the times the decode loops measured."""

from __future__ import annotations

import pytest

from eagle3.evaluate.offline import MODELLED_FORMULA, modelled_speedup
from eagle3.evaluate.speculative import Decoded, StepTimes


def test_the_formula_is_applied_to_the_mean_times_per_round_and_written_out() -> None:
    a = Decoded([1, 2, 3], draft=StepTimes(0.03, 3), verify=StepTimes(0.06, 3))  # 10 ms draft, 20 ms verify a round
    b = Decoded([4], draft=StepTimes(0.01, 1), verify=StepTimes(0.02, 1))
    m = modelled_speedup([a, b], acceptance_length=2.4, target_step_s=0.015)
    assert (m.draft_s, m.verify_s) == (pytest.approx(0.01), pytest.approx(0.02))
    assert m.speedup == pytest.approx(2.4 * 0.015 / 0.03)
    assert m.formula == MODELLED_FORMULA == "speed-up = tau * t_step / (t_verify + t_draft)"
    assert modelled_speedup([Decoded([1])], 1.0, 0.01).speedup == 0.0  # no round measured: no claim


def test_acceptance_by_context_length_pools_the_rounds_of_each_buckets_prompts() -> None:
    from eagle3.evaluate.offline import PromptStats, context_buckets

    def prompt(tokens: int, rounds: int, accepted: int) -> PromptStats:
        return PromptStats(prompt_tokens=tokens, new_tokens=rounds + accepted, rounds=rounds, accepted=accepted,
                           identical_to_greedy=True)  # fmt: skip

    buckets = context_buckets([prompt(100, 10, 10), prompt(2047, 10, 0), prompt(5000, 4, 6), prompt(40000, 5, 0)])
    assert [(b.label, b.num_prompts, b.rounds) for b in buckets] == [("0-2K", 2, 20), ("2-8K", 1, 4), ("32K+", 1, 5)]
    assert [b.acceptance_length for b in buckets] == [1.5, 2.5, 1.0]
