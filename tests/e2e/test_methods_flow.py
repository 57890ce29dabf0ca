"""Several draft methods from one store through the train flow against a real Prefect server: EAGLE-3 and EAGLE-3.1
trained from the demo store, each exported and evaluated in its own directory, compared side by side in the
`<run>-methods` artifact, and the winner (by modelled speed-up) through the promotion gate into draft/current."""

from __future__ import annotations

from pathlib import Path

import pytest

from eagle3.config import PipelineConfig
from eagle3.release.promote import read_promotion
from eagle3.store.fsio import read_json
from tests.e2e.test_flows import latest_artifact
from tests.integration.demo_facts import build_demo_store

pytestmark = pytest.mark.slow


def test_two_methods_are_trained_evaluated_compared_and_the_winner_promoted(
    prefect_server: str, demo_model: Path, tmp_path: Path
) -> None:
    from flows.train import train_flow

    store = build_demo_store(tmp_path, demo_model)
    cfg = PipelineConfig.model_validate({
        **store.model_dump(), "stages": ["train", "export", "evaluate"],
        "train": {**store.train.model_dump(), "methods": ["eagle3", "eagle3.1"], "max_steps": 6, "lr": 3e-3,
                  "loader_threads": 1},
        "evaluate": {**store.evaluate.model_dump(), "live": "off", "device": "cpu", "compare_steps": [2]},
    })  # fmt: skip
    state = train_flow(cfg, return_state=True)
    assert state.is_completed(), state.message
    run = Path(cfg.run_dir)
    evals = {"eagle3": run / "eval", "eagle3.1": run / "draft" / "eagle3.1" / "eval"}
    offline = {m: read_json(p / "offline.json") for m, p in evals.items()}
    for method, result in offline.items():
        assert result["method"] == method and result["modelled"]["speedup"] > 0
        assert result["identical_to_greedy"] == result["num_prompts"] == 3
    assert read_json(run / "draft" / "eagle3.1" / "latest" / "export.json")["method"] == "eagle3.1"

    methods = latest_artifact(f"{run.name}-methods")  # the side-by-side table and the candidate
    assert "| eagle3 | held-out | 2 |" in methods.data and "| eagle3.1 | held-out | 2 |" in methods.data
    winner = max(offline, key=lambda m: offline[m]["modelled"]["speedup"])
    decision = read_promotion(run)
    assert decision is not None and decision.promoted and decision.method == winner
    assert decision.chosen.startswith(f"{winner} wins by modelled speed-up")
    assert (run / "draft" / "current").resolve() == (run / "draft" / ("" if winner == "eagle3" else winner)
                                                      / "latest").resolve()  # fmt: skip
    assert decision.candidate_eval.method == winner
