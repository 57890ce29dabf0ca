"""The documented first training (docs/gpu-node.md, "Training the draft on the node") in the browser (Debian's
Chromium, driven by Playwright): a user opens the `train` deployment, fills only `Run Dir` with a converted store (a
copy of the shared demo store: tests/integration/demo_facts.py), submits, and the run Completes on this CPU worker
with the deployment's own settings (devices `auto`, the store's vocabulary map); its page says Completed, and its
artifacts hold the run summary and the evaluation.

It costs what the deployment's defaults cost on a CPU (one training step of the 12 conversations, the evaluation at
the CPU's size, 8 prompts x 32 tokens at k = 3 and 5, the live one in SGLang where its environment exists): the price
of testing the walk as a user meets it."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest

pytest.importorskip("playwright", reason="pip install -e '.[dev]' (make test does)")
from playwright.sync_api import Page, expect

from tests.ui.conftest import Served
from tests.ui.prefect_ui import (
    fill,
    open_artifact,
    open_custom_run,
    open_tab,
    shot,
    submit_and_open_run,
    wait_for_state_off_page,
)

pytestmark = [pytest.mark.ui, pytest.mark.slow]

WALK_TIMEOUT_S = 1800.0  # the defaults on a loaded 2-core box (docs/testing.md has this test's time)


def test_the_train_form_given_only_run_dir_completes_on_the_demo_store_on_this_cpu_worker(
    served: Served, page: Page, demo_store_dir: Path, tmp_path: Path
) -> None:
    from prefect import get_client

    run_dir = tmp_path / "ui-train"
    shutil.copytree(demo_store_dir, run_dir)  # a copy: the run writes its draft and evaluation into the store
    open_custom_run(page, "train", "train")
    fill(page, "Run Dir", str(run_dir))  # nothing else
    url = submit_and_open_run(page)
    with get_client(sync_client=True) as client:
        given = client.read_flow_run(uuid.UUID(url.rstrip("/").split("/")[-1])).parameters
    assert given["config"]["run_dir"] == str(run_dir) and not given.get("overrides")

    wait_for_state_off_page(page, url, "Completed", timeout_s=WALK_TIMEOUT_S)
    shot(page, "49-train-walk-completed")
    open_tab(page, "Artifacts")
    for key in ("run-summary", "evaluation", "train-progress"):
        expect(page.get_by_text(f"{run_dir.name}-{key}", exact=True).first).to_be_visible()
    shot(page, "49-train-walk-artifacts", full_page=True)

    open_artifact(page, f"{run_dir.name}-evaluation")
    expect(page.get_by_text("Evaluation of the eagle3 draft").first).to_be_visible()
    expect(page.get_by_text("32 new tokens, greedy", exact=False).first).to_be_visible()  # a CPU's default size
    shot(page, "49-train-walk-evaluation", full_page=True)
    page.go_back()
    open_artifact(page, f"{run_dir.name}-run-summary")
    expect(page.get_by_text("Settings given by this run: run_dir", exact=False).first).to_be_visible()
    shot(page, "49-train-walk-summary", full_page=True)
    assert (run_dir / "draft" / "current").is_dir()  # promoted: the first draft of this store
