"""A failed flow run says why where a user looks first, for every kind of flow: its state message leads with
the stage and the first error and ends with what to do, and a `<run>-failure` markdown artifact says what
failed, the first error and the one thing to do (against a real local Prefect server)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from eagle3.config import load_config
from eagle3.extract.shard import extract_shard
from tests.e2e.test_flows import latest_artifact
from tests.unit.tiny_store import ScriptedEngine, make_store

pytestmark = pytest.mark.slow


def failure_of(state: Any, run_dir: Path) -> tuple[str, str]:
    """(state message, markdown of the run's `<run>-failure` artifact)."""
    assert state.is_failed(), state.message
    artifact = latest_artifact(f"{run_dir.name}-failure")
    assert str(artifact.flow_run_id) == str(state.state_details.flow_run_id)
    return state.message or "", str(artifact.data)


def test_a_prepare_failure_names_the_stage_the_missing_file_and_the_fix(prefect_server: str, tmp_path: Path) -> None:
    from flows.pipeline import pipeline

    run_dir = tmp_path / "no-data"
    missing = tmp_path / "nowhere.jsonl"
    cfg = load_config(None, [f"run_dir={run_dir}", f"data.dataset={missing}", "stages=[prepare]"])
    message, markdown = failure_of(pipeline(cfg, return_state=True), run_dir)
    assert message.startswith("prepare failed: ") and str(missing) in message
    assert "What to do: Check `data.dataset`" in message and "on_bad_row" not in message  # no row was read
    assert "**What failed:** the `prepare` task (stage `prepare`) of flow run `pipeline " in markdown
    assert str(missing) in markdown and "**What to do:** Check `data.dataset`" in markdown


def test_a_verify_that_finds_bad_samples_points_to_the_retry_failed_deployment(
    prefect_server: str, tmp_path: Path
) -> None:
    from flows.verify import verify_flow

    store, info = make_store(tmp_path / "damaged", [[6, 9], [5]])
    for shard in (0, 1):
        assert extract_shard(store, shard, ScriptedEngine(info), info).status == "complete"
    sample = store.sample_path(0, "s0-001")
    sample.write_bytes(sample.read_bytes()[:20])  # truncated
    message, markdown = failure_of(verify_flow(str(store.root), return_state=True), store.root)
    assert message.startswith("verify failed: ") and "bad: s0-001 (shard 0)" in message
    assert "retry-failed deployment with run_dir" in message and "retry-failed deployment" in markdown


def test_a_failure_of_the_flow_itself_is_reported_with_its_error(prefect_server: str, tmp_path: Path) -> None:
    from flows.retry import retry_failed_flow

    run_dir = tmp_path / "never-extracted"
    run_dir.mkdir()
    message, markdown = failure_of(retry_failed_flow(str(run_dir), return_state=True), run_dir)
    assert message.startswith("run-config failed: NoStoreError: ") and "is not a store" in message
    assert f"`{run_dir}` holds no store" in markdown and "nothing here to verify or retry" in markdown


def test_a_templated_run_dir_keys_the_failure_and_names_the_run_with_its_filled_value(
    prefect_server: str, tmp_path: Path, demo_model: Path
) -> None:
    from prefect.client.orchestration import get_client

    from eagle3.target.files import model_fingerprint
    from flows.pipeline import pipeline

    template = str(tmp_path / "ui-grow-{model_sha}")
    cfg = load_config(None, [f"run_dir={template}", f"model={demo_model}", f"data.dataset={tmp_path / 'none.jsonl'}",
                             "stages=[prepare]"])  # fmt: skip
    state = pipeline(cfg, return_state=True)
    run_dir = Path(template.format(model_sha=model_fingerprint(demo_model)[:12]))
    message, markdown = failure_of(state, run_dir)  # keyed `ui-grow-<sha>-failure`, as the store's other artifacts
    assert message.startswith("prepare failed: ") and f"`{run_dir.resolve()}`" in markdown
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(state.state_details.flow_run_id).name == f"pipeline {run_dir}"
