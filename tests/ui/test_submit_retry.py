"""The UI tests' submit helper survives the flake CI met twice under load: the UI's create request fails, the form
stays open with "Oops. Something went wrong." (in CI, session 8, not rendered as a .p-toast), and no run exists.
Here the server error is injected (the test's route answers the first create request with a 500), so the path
runs every time."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("playwright", reason="pip install -e '.[dev]' (make test does)")
from playwright.sync_api import Page, Route

from tests.ui.conftest import Served
from tests.ui.prefect_ui import fill, open_custom_run, remove_tags, submit_and_open_run

pytestmark = [pytest.mark.ui, pytest.mark.slow]


def test_a_create_request_failing_once_injected_500_is_submitted_again_and_the_run_starts(
    served: Served, page: Page, tmp_path: Path
) -> None:
    refused: list[str] = []

    def first_create_fails(route: Route) -> None:
        if not refused and route.request.method == "POST":
            refused.append(route.request.url)
            route.fulfill(status=500, body='{"detail": "injected by the test"}', content_type="application/json")
        else:
            route.continue_()

    page.route("**/create_flow_run", first_create_fails)
    open_custom_run(page, "pipeline", "pipeline")
    fill(page, "Run Dir", str(tmp_path / "retried"))
    remove_tags(page, "Stages", keep=["prepare"])
    fill(page, "Dataset", str(tmp_path / "no-such-prompts.jsonl"))
    url = submit_and_open_run(page)
    assert len(refused) == 1 and "/runs/flow-run/" in url  # refused once, then created and opened
