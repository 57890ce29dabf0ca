"""The product as a user sees it in the Prefect UI (Debian's Chromium, driven by Playwright), against the node
that `make serve` sets up (deploy/serve.sh: server, pool, limits, deployments, automations, worker).

Runs are tiny (4 demo prompts, 2 per shard, no synthesis, the in-process transformers engine on CPU) so
the module fits a 2-core CI runner: about three flow runs of 20-60 s each.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

pytest.importorskip("playwright", reason="pip install -e '.[dev]' (make test does)")
from playwright.sync_api import Page, expect

from tests.ui.conftest import Served
from tests.ui.prefect_ui import (
    add_items,
    deployment_link,
    fill,
    open_artifact,
    open_custom_run,
    open_subflow,
    prop,
    remove_tags,
    settle,
    shot,
    submit_and_open_run,
    table_rows,
    wait_for_state,
)

pytestmark = [pytest.mark.ui, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
DEPLOYMENTS = {
    "pipeline/pipeline",
    "pipeline/convert",
    "pipeline/grow",
    "train/train",
    "extract/extract",
    "extract/extract-node",
    "extract-fanout/extract-fanout",
    "train-fanout/train-fanout",
    "train-node/train-node",
    "retry-failed/retry-failed",
    "verify/verify",
}


def key_prefix(run_dir: Path) -> str:
    return run_dir.name  # tasks/artifacts.run_key: artifact keys start with the run directory's name


def fill_pipeline_form(page: Page, run_dir: Path, stages: list[str]) -> None:
    """Non-default parameters: the run directory, the stages, 4 samples in shards of 2, no shard retries."""
    fill(page, "Run Dir", str(run_dir))
    remove_tags(page, "Stages", keep=stages)
    # the keys the form does not show, as `key.sub=value` lines (the flows' `overrides`)
    add_items(page, "Overrides", ["data.max_samples=4", "data.shard_size=2", "data.max_length=512",
                                 "extract.shard_retries=0"])  # fmt: skip
    prop(page, "Run Dir").scroll_into_view_if_needed()


def check_form_parameters(url: str, run_dir: Path, stages: list[str]) -> None:
    """What the form sent is what fill_pipeline_form typed (read back through the API)."""
    from prefect import get_client

    with get_client(sync_client=True) as client:
        params = client.read_flow_run(uuid.UUID(url.rstrip("/").split("/")[-1])).parameters
    config = params["config"]
    assert config["run_dir"] == str(run_dir) and config["stages"] == stages
    assert params["overrides"] == ["data.max_samples=4", "data.shard_size=2", "data.max_length=512",
                                   "extract.shard_retries=0"]  # fmt: skip


def test_make_serve_registers_the_pool_limits_deployments_schedule_and_automations(served: Served) -> None:
    from prefect import get_client

    with get_client(sync_client=True) as client:
        pool = client.read_work_pool("eagle3-gpu")
        assert pool.type == "process"
        assert pool.base_job_template["variables"]["properties"]["env"]["default"] == {
            "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30"
        }
        assert client.read_global_concurrency_limit_by_name("gpu").limit == 1
        flows = {f.id: f.name for f in client.read_flows()}
        deployments = {f"{flows[d.flow_id]}/{d.name}": d for d in client.read_deployments()}
        assert set(deployments) == DEPLOYMENTS
        for name, d in deployments.items():
            assert d.work_pool_name == "eagle3-gpu", name
            limit = 64 if name in ("extract/extract-node", "train-node/train-node") else 1  # one run per node at once
            assert d.global_concurrency_limit is not None and d.global_concurrency_limit.limit == limit, name
            assert d.pull_steps == [{"prefect.deployments.steps.set_working_directory": {"directory": str(REPO)}}], name
        pipeline = deployments["pipeline/pipeline"]
        assert pipeline.entrypoint == "flows/pipeline.py:pipeline"
        assert "shard_size" not in pipeline.parameters["config"].get("data", {})  # no defaults stored: forms are short
        (nightly,) = pipeline.schedules
        assert nightly.slug == "re-extract-nightly" and not nightly.active
        assert nightly.parameters["config"]["run_dir"] == "data/runs/nightly"
        assert deployments["pipeline/convert"].parameters["config"]["stages"] == ["convert"]
        automations = {a.name: a for a in client.read_automations()}
        assert automations["crash-zombie-runs"].enabled
        assert not automations["retry-failed-shards"].enabled


def test_a_pipeline_run_from_the_form_completes_with_full_progress_and_a_shard_table(
    served: Served, page: Page, tmp_path: Path
) -> None:
    run_dir = tmp_path / "ui-first"
    page.goto("/deployments")
    settle(page)
    for name in sorted(DEPLOYMENTS):
        flow, deployment = name.split("/")
        expect(deployment_link(page, deployment, flow)).to_be_visible()
    shot(page, "01-deployments")

    open_custom_run(page, "pipeline", "pipeline")
    fill_pipeline_form(page, run_dir, ["prepare", "extract"])
    shot(page, "02-run-form")
    url = submit_and_open_run(page, screenshot="03-run-submitted")
    check_form_parameters(url, run_dir, ["prepare", "extract"])
    wait_for_state(page, "Completed")
    shot(page, "04-run-completed")

    open_artifact(page, f"{key_prefix(run_dir)}-run-summary")  # the pipeline's last artifact
    expect(page.get_by_text("4/4 samples, 2/2 shards complete")).to_be_visible()
    expect(page.get_by_role("link", name=f"{key_prefix(run_dir)}-extract-shards")).to_be_visible()
    shot(page, "05-run-summary")
    page.go_back()
    settle(page)

    open_subflow(page, f"extract {run_dir}")
    open_artifact(page, f"{key_prefix(run_dir)}-extract-progress")
    expect(page.get_by_text("Progress: 100%")).to_be_visible()
    expect(page.get_by_text("4/4 samples in store, 2/2 shards complete")).to_be_visible()
    page.go_back()
    settle(page)
    open_artifact(page, f"{key_prefix(run_dir)}-extract-shards")
    rows = table_rows(page)
    assert [(r["shard"], r["status"], r["samples"]) for r in rows] == [("0", "complete", "2"), ("1", "complete", "2")]
    shot(page, "06-shard-table")


def prepare_with_a_broken_sample(run_dir: Path, demo_model: Path) -> bytes:
    """prepare run_dir (4 demo prompts, shards of 2), then give shard 1's first sample a token id past the
    vocabulary: the engine refuses that sample, so extraction leaves shard 1 partial (tests/e2e does the same)."""
    from eagle3.config import load_config
    from eagle3.data.prepare import prepare
    from eagle3.store.run_store import RunStore

    cfg = load_config(
        None,
        [f"run_dir={run_dir}", "data.max_samples=4", "data.shard_size=2", "data.max_length=512"],
    )
    store = RunStore(cfg.run_dir)
    prepare(cfg, store, demo_model)
    good = store.prepared_shard_path(1).read_bytes()
    table = store.read_prepared_shard(1)
    rows: dict[str, Any] = table.to_pydict()
    rows["input_ids"][0] = [1, 2, 10**6]
    rows["loss_mask"][0] = [0, 1, 1]
    store.write_prepared_shard(1, pa.Table.from_pydict(rows, schema=table.schema))
    return good


def test_a_failed_shard_shows_in_the_failed_shards_table_and_retry_failed_from_the_ui_completes_it(
    served: Served, page: Page, tmp_path: Path, demo_model: Path
) -> None:
    run_dir = tmp_path / "ui-broken"
    good_shard_1 = prepare_with_a_broken_sample(run_dir, demo_model)

    open_custom_run(page, "pipeline", "pipeline")
    fill_pipeline_form(page, run_dir, ["extract"])
    check_form_parameters(submit_and_open_run(page), run_dir, ["extract"])
    wait_for_state(page, "Failed")
    # the flow's own log lines reach the page after its state: sent in batches by its process, polled by the page
    expect(page.get_by_text("shard 1").first).to_be_visible(timeout=30_000)
    shot(page, "07-run-failed")

    open_subflow(page, f"extract {run_dir}")
    open_artifact(page, f"{key_prefix(run_dir)}-extract-failed-shards")
    rows = table_rows(page)
    assert [(r["shard"], r["status"]) for r in rows] == [("1", "partial")]
    assert "out of range" in rows[0]["error"]
    expect(page.get_by_text("retry", exact=False).first).to_be_visible()
    shot(page, "08-failed-shards", full_page=True)

    # The cause is fixed (the prepared shard is good again); retry from the UI: the retry-failed deployment.
    from eagle3.store.run_store import RunStore

    store = RunStore(run_dir)
    store.prepared_shard_path(1).write_bytes(good_shard_1)

    open_custom_run(page, "retry-failed", "retry-failed")
    fill(page, "Run Dir", str(run_dir))
    shot(page, "09-retry-form")
    submit_and_open_run(page)
    wait_for_state(page, "Completed")
    shot(page, "10-retry-completed")

    open_artifact(page, f"{key_prefix(run_dir)}-extract-shards")
    rows = table_rows(page)
    assert [(r["shard"], r["status"]) for r in rows] == [("1", "complete")]  # the retry ran only shard 1
    status = {m.shard: m.status for m in store.manifests()}
    assert status == {0: "complete", 1: "complete"}
    info = json.loads(store.run_json.read_text())
    assert info["engine"] == "transformers"
