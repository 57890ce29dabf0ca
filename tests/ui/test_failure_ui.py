"""A failed run says why at the top, in the browser (Debian's Chromium, driven by Playwright): a pipeline run
from the form whose dataset does not exist ends Failed; its Details tab shows the reason as the state message
(the stage, the first error, what to do), and its `<run>-failure` artifact (also on the run's graph, above the
logs) says what failed, the first error and what to do; no log needs reading."""

from __future__ import annotations

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
    remove_tags,
    shot,
    submit_and_open_run,
    wait_for_state,
)

pytestmark = [pytest.mark.ui, pytest.mark.slow]


def test_a_failed_run_shows_its_reason_on_its_page_and_in_its_failure_artifact(
    served: Served, page: Page, tmp_path: Path
) -> None:
    run_dir = tmp_path / "ui-no-data"
    missing = tmp_path / "no-such-prompts.jsonl"
    open_custom_run(page, "pipeline", "pipeline")
    fill(page, "Run Dir", str(run_dir))
    remove_tags(page, "Stages", keep=["prepare"])
    fill(page, "Dataset", str(missing))
    submit_and_open_run(page)
    wait_for_state(page, "Failed")
    shot(page, "13-run-failed")  # the run's graph (a canvas) carries the `<run>-failure` artifact, above the logs
    # Details: the state message is the reason, the stage first.
    open_tab(page, "Details")
    reason = page.get_by_text("prepare failed:", exact=False).first
    expect(reason).to_be_visible()
    more = page.get_by_text("See More", exact=False)
    if more.count():  # the Details panel truncates a long message
        more.first.click()
    expect(reason).to_contain_text(str(missing))
    expect(reason).to_contain_text("What to do: Check `data.dataset`")
    shot(page, "14-run-failed-details")

    open_artifact(page, f"{run_dir.name}-failure")
    expect(page.get_by_text("What failed:", exact=False).first).to_be_visible()
    expect(page.get_by_text("What to do:", exact=False).first).to_be_visible()
    expect(page.get_by_text("Check data.dataset", exact=False).first).to_be_visible()  # the artifact renders `code`
    shot(page, "15-failure-artifact")
