"""The deployments' forms as a new user meets them (Debian's Chromium, driven by Playwright): a pipeline run
submitted without edits starts nothing (the run directory is required, so it never lands in another run's
store), every parameter of the small forms has a title and a description, and the pipeline form holds only
the sections of the stages it runs by default."""

from __future__ import annotations

import uuid

import pytest

pytest.importorskip("playwright", reason="pip install -e '.[dev]' (make test does)")
from playwright.sync_api import Page, expect

from tests.ui.conftest import Served
from tests.ui.prefect_ui import body, open_custom_run, prop, shot

pytestmark = [pytest.mark.ui, pytest.mark.slow]

NONE_TYPE = 'Property is type "None"'


def flow_run_count(deployment: str) -> int:
    from prefect import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    with get_client(sync_client=True) as client:
        dep_id = client.read_deployment_by_name(deployment).id
        flt = DeploymentFilter(id=DeploymentFilterId(any_=[uuid.UUID(str(dep_id))]))
        return len(client.read_flow_runs(deployment_filter=flt))


def test_a_pipeline_run_submitted_without_edits_starts_nothing_and_names_the_missing_run_dir(
    served: Served, page: Page
) -> None:
    before = flow_run_count("pipeline/pipeline")
    open_custom_run(page, "pipeline", "pipeline")
    run_dir = body(prop(page, "Run Dir"))
    expect(run_dir.locator("textarea, input").first).to_have_value("")  # no default store to write into
    page.get_by_role("button", name="Submit").click()
    expect(page.get_by_text("'run_dir' is a required property")).to_be_visible()
    shot(page, "11-default-submit-refused")
    page.wait_for_timeout(3000)  # a run created now would show up in the count below
    assert "/run" in page.url  # still on the form
    assert flow_run_count("pipeline/pipeline") == before


@pytest.mark.parametrize(
    ("deployment", "labels"),
    [
        ("verify", {"Run Dir": "run directory (store) to check", "Quick": "headers, shapes and sizes only",
                    "Shards": "Empty: every shard"}),
        ("retry-failed", {"Run Dir": "run directory (store) to repair", "Shards": "Empty: every failed or partial"}),
    ],
)  # fmt: skip
def test_the_small_forms_show_a_title_and_a_description_for_every_parameter(
    served: Served, page: Page, deployment: str, labels: dict[str, str]
) -> None:
    open_custom_run(page, deployment, deployment)
    for label, description in labels.items():
        expect(prop(page, label)).to_contain_text(description)
    expect(page.get_by_text(NONE_TYPE)).to_have_count(0)
    for raw in ("run_dir", "quick", "shards"):
        expect(page.locator(".schema-form-property__label").get_by_text(raw, exact=True)).to_have_count(0)
    shot(page, f"12-{deployment}-form")


def test_the_pipeline_form_shows_the_common_case_and_marks_each_section_with_its_stages(
    served: Served, page: Page
) -> None:
    open_custom_run(page, "pipeline", "pipeline")
    expect(prop(page, "Data")).to_contain_text("Only the prepare stage reads this section; its other keys: Overrides")
    labels = page.locator(".schema-form-property__label")
    assert not [t for t in labels.all_inner_texts() if t.startswith(("Train ", "Evaluate "))]  # the train form's
    # was 88 with every section; 47 when first cut, before #16 and #19 added their keys (data sources, Hub subset
    # and revision, chat template and kwargs, synthesize concurrency/timeouts/retries/on_truncated, store_dtype)
    assert labels.count() < 70
    open_custom_run(page, "train", "train")
    expect(prop(page, "Train")).to_contain_text("Only the stages convert, train read this section")
    train_labels = page.locator(".schema-form-property__label").all_inner_texts()
    assert not [t for t in train_labels if t.split(" (")[0] in ("Synthesize", "Data", "Extract")]
