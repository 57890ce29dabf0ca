"""Issue 34 in the browser (Debian's Chromium, driven by Playwright): a run started the way docs/gpu-node.md
teaches, `prefect deployment run train/train --params '{"config": {"run_dir": ...}}'`, keeps the train
deployment's stages and devices, and its page's logs say which settings came from where; the forms of the
deployments that take `config` show no str/None switch ("Property is type None")."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("playwright", reason="pip install -e '.[dev]' (make test does)")
from playwright.sync_api import Page, expect

from tests.ui.conftest import Served
from tests.ui.prefect_ui import (
    add_items,
    fill,
    open_custom_run,
    prop,
    settle,
    shot,
    submit_and_open_run,
    wait_for_state,
)

pytestmark = [pytest.mark.ui, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
NONE_TYPE = 'Property is type "None"'


@pytest.mark.parametrize(
    ("deployment", "flow"),
    [("pipeline", "pipeline"), ("train", "train"), ("extract", "extract"), ("grow", "pipeline")],
)
def test_the_config_forms_show_no_null_switch(served: Served, page: Page, deployment: str, flow: str) -> None:
    open_custom_run(page, deployment, flow)
    expect(page.locator(".schema-form-property__label").first).to_be_visible()
    expect(page.get_by_text(NONE_TYPE)).to_have_count(0)
    shot(page, f"34-{deployment}-form-no-null-switch")


@pytest.mark.parametrize(
    ("deployment", "flow"),
    [("pipeline", "pipeline"), ("extract", "extract"), ("convert", "pipeline"), ("train", "train"),
     ("grow", "pipeline"), ("extract-fanout", "extract-fanout"), ("train-fanout", "train-fanout"),
     ("train-node", "train-node")],
)  # fmt: skip
def test_each_config_form_fits_two_screens_at_1280x800_with_the_rest_in_overrides(
    served: Served, page: Page, deployment: str, flow: str
) -> None:
    page.set_viewport_size({"width": 1280, "height": 800})
    open_custom_run(page, deployment, flow)
    expect(prop(page, "Overrides")).to_be_visible()
    submit = page.get_by_role("button", name="Submit")
    # where Submit sits below the top of the page, scrolled or not (the UI may scroll an inner container)
    bottom = submit.evaluate(
        "e => { let y = e.getBoundingClientRect().bottom, p = e.parentElement;"
        " while (p) { y += p.scrollTop; p = p.parentElement; } return y + window.scrollY; }"
    )
    shot(page, f"34-{deployment}-form-1280x800", full_page=True)
    assert bottom <= 2 * 800, f"{deployment}: Submit is {bottom:.0f} px down (two screens: 1600)"


def test_a_train_run_given_only_run_dir_keeps_the_deployments_stages_and_says_so(
    served: Served, page: Page, tmp_path: Path
) -> None:
    from prefect import get_client

    params = json.dumps({"config": {"run_dir": str(tmp_path / "partial")}})
    out = subprocess.run(  # as docs/gpu-node.md writes it
        [sys.executable, "-m", "prefect", "deployment", "run", "train/train", "--params", params],
        cwd=REPO, env=served.env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    run_id = re.search(r"/runs/flow-run/([0-9a-f-]{36})", out.stdout + out.stderr)
    assert run_id, out.stdout
    page.goto(f"/runs/flow-run/{run_id.group(1)}")
    settle(page)
    wait_for_state(page, "Failed")  # no converted store in run_dir: train's preflight refuses, but it is train's
    expect(page.get_by_text("Settings given by this run: run_dir", exact=False).first).to_be_visible(timeout=30_000)
    kept = "Settings of the deployment `train/train` kept: stages"  # devices `auto`: they follow the worker
    expect(page.get_by_text(kept, exact=False).first).to_be_visible()
    shot(page, "34-partial-config-run-logs")
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(run_id.group(1))
        names = {t.name.split("-")[0] for t in client.read_task_runs()  if t.flow_run_id == run.id}  # fmt: skip
    assert run.state is not None and not (run.state.message or "").startswith("prepare")
    assert "prepare" not in names and "synthesize" not in names  # not the pipeline's default stages


def test_a_setting_the_form_does_not_show_is_set_in_overrides_and_reaches_the_run(
    served: Served, page: Page, tmp_path: Path
) -> None:
    from prefect import get_client

    open_custom_run(page, "train", "train")
    fill(page, "Run Dir", str(tmp_path / "overridden"))
    add_items(page, "Overrides", ["train.lr=0.001", "evaluate.device=cpu"])
    url = submit_and_open_run(page)
    with get_client(sync_client=True) as client:
        params = client.read_flow_run(url.rstrip("/").split("/")[-1]).parameters
    assert params["overrides"] == ["train.lr=0.001", "evaluate.device=cpu"]
    wait_for_state(page, "Failed")  # no converted store: refused, after the settings were merged and logged
    expect(page.get_by_text("Settings given by this run: evaluate.device, run_dir, train.lr", exact=False).first
           ).to_be_visible(timeout=30_000)  # fmt: skip
