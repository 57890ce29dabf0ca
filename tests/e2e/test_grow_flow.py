"""The pipeline flow on a real Prefect server with a run_dir template and promotion: the demo data through
prepare -> extract -> convert -> train -> export -> evaluate (offline; live off to keep it short) -> promote.
The first draft becomes draft/current with an `eagle3.draft.promoted` event, the promotion artifact and a
summary row; run_dir's {model_sha} is filled in once and recorded; a second run with nothing new keeps it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from eagle3.config import load_config
from tests.e2e.test_flows import latest_artifact, write_config
from tests.e2e.test_reliability import events

pytestmark = pytest.mark.slow


def test_the_pipeline_fills_in_run_dir_and_promotes_its_first_draft_with_an_event(
    prefect_server: str, demo_model: Path, tmp_path: Path
) -> None:
    from flows.pipeline import pipeline

    path = write_config(tmp_path, "run", ("prepare", "extract", "convert", "train", "export", "evaluate"))
    raw = yaml.safe_load(path.read_text())
    raw["evaluate"]["live"] = "off"
    raw["run_dir"] = str(tmp_path / "runs" / "demo-{model_sha}")
    path.write_text(yaml.safe_dump(raw))
    cfg = load_config(path)
    state = pipeline(cfg, return_state=True)
    assert state.is_completed(), state.message
    root = Path(state.result())
    assert root.name.startswith("demo-") and len(root.name) == 17
    promotion = json.loads((root / "draft" / "promotion.json").read_text())
    assert promotion["promoted"], promotion
    (event,) = events("eagle3.draft.promoted", f"eagle3.run.{root.name}")
    assert event.payload["reason"] == promotion["reason"]
    art = latest_artifact(f"{root.name}-promotion")
    assert "draft/current" in art.data
    assert "**promoted**" in latest_artifact(f"{root.name}-run-summary").data
    info = json.loads((root / "run.json").read_text())
    assert info["run_dir_template"] == raw["run_dir"]
    # a second run: nothing new -> train done, export skipped, promote "already current"
    state = pipeline(cfg, return_state=True)
    assert state.is_completed(), state.message
    promotion = json.loads((root / "draft" / "promotion.json").read_text())
    assert promotion["promoted"] and "already the current draft" in promotion["reason"], promotion
