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
