"""What a person does in the Prefect 3.9 UI (the Vue app), as small functions over a Playwright page.

Selectors are text and roles where the UI has them; the parameter form's fields are found by their visible
label (the form's <label for=...> points at no element, so `get_by_label` cannot be used).
"""

from __future__ import annotations

import contextlib
import re
import time
import uuid
from pathlib import Path
from typing import Any

from playwright.sync_api import Locator, Page, Response, expect
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

OUT = Path(__file__).resolve().parents[2] / "test-output" / "ui"
RUN_TIMEOUT_S = 300.0  # one flow run on a loaded 2-core runner: worker pickup, interpreter start, model load


def shot(page: Page, name: str, *, full_page: bool = False) -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    return path


def settle(page: Page) -> None:
    page.wait_for_load_state("networkidle")


def dismiss_toasts(page: Page) -> None:
    """Close the UI's toasts (bottom right): one left over can lie on top of the element a test clicks next."""
    for close in page.locator("#prefect-design-toast-app").get_by_role("button", name="Close").all():
        with contextlib.suppress(PlaywrightTimeoutError):  # already gone
            close.dispatch_event("click", timeout=2_000)


# --- the parameter form ---------------------------------------------------------------------------------------


def prop(scope: Page | Locator, label: str) -> Locator:
    """The form property labelled `label` (or `label (Optional)`), first match inside `scope`."""
    xpath = (
        "xpath=.//div[contains(concat(' ', normalize-space(@class), ' '), ' schema-form-property ')]"
        "[./div[contains(@class,'p-label__header')]//span[contains(@class,'schema-form-property__label')]"
        f"[normalize-space()='{label}' or normalize-space()='{label} (Optional)']]"
    )
    return scope.locator(xpath).first


def body(p: Locator) -> Locator:
    return p.locator("xpath=./div[contains(@class,'p-label__body')]")


def fill(scope: Page | Locator, label: str, value: str) -> None:
    """Type into a text or number field. A nullable field showing "None" is switched to its value type first."""
    p = body(prop(scope, label))
    expect(p).to_be_visible()
    control = p.locator("xpath=.//*[self::textarea or self::input]").first
    if control.count() == 0:
        p.get_by_role("button").filter(has_not_text=re.compile(r"^\s*None\s*$")).first.click()
    control.fill(value)


def remove_tags(scope: Page | Locator, label: str, keep: list[str]) -> None:
    """In a multi-select (e.g. config.stages), dismiss every selected tag not in `keep`."""
    tags = body(prop(scope, label)).locator("span.p-tag:visible")  # the tag wrapper also keeps hidden copies
    for _ in range(20):
        names = [n.strip() for n in tags.all_inner_texts()]
        extra = [n for n in names if n not in keep]
        if not extra:
            break
        tags.filter(has_text=re.compile(f"^\\s*{re.escape(extra[0])}\\s*$")).locator("button").click()
        expect(tags).to_have_count(len(names) - 1)
    expect(tags).to_have_count(len(keep))


def add_items(scope: Page | Locator, label: str, values: list[str]) -> None:
    """In a list-of-strings field (e.g. a flow's `overrides`: "No items in this list", an "Add item" button), add
    one item per value and type it."""
    p = body(prop(scope, label))
    expect(p).to_be_visible()
    fields = p.locator("xpath=.//*[self::textarea or self::input]")
    for i, value in enumerate(values):
        p.get_by_role("button", name="Add item").click()
        expect(fields).to_have_count(i + 1)
        fields.nth(i).fill(value)


# --- deployments and runs -------------------------------------------------------------------------------------


def deployment_link(page: Page, deployment: str, flow: str) -> Locator:
    """The deployment's name link in the Deployments list (its row also names the flow). The list shows ten a
    page and the project has more deployments: the list is searched for the name first."""
    page.get_by_role("searchbox", name="Search deployments").fill(deployment)
    settle(page)
    row = page.locator("tr").filter(has=page.get_by_text(flow, exact=True))
    return row.locator("a.deployment-list__name").filter(has_text=re.compile(f"^{re.escape(deployment)}$"))


def open_custom_run(page: Page, deployment: str, flow: str) -> None:
    """Deployments -> <deployment> (of <flow>) -> Run -> Custom run: the parameter form."""
    page.goto("/deployments")
    settle(page)
    dismiss_toasts(page)
    deployment_link(page, deployment, flow).click()
    run = page.get_by_role("button", name="Run", exact=True)
    expect(run).to_be_visible()
    run.click()
    page.get_by_text("Custom run", exact=True).click()
    expect(page.get_by_role("button", name="Submit")).to_be_visible()
    settle(page)


def is_create_flow_run(response: Response) -> bool:
    return response.request.method == "POST" and response.url.rstrip("/").endswith("/create_flow_run")


def submit_and_open_run(page: Page, screenshot: str | None = None) -> str:
    """Submit the form; the UI returns to the deployment with a toast "<run> scheduled to start now" and a
    "View run" button: follow it (or, once the toast is gone, the run's link on the deployment page).
    Returns the flow run page's URL."""
    toast = page.locator(".toast-flow-run-create, .p-toast").filter(has_text="scheduled to start").first
    for attempt in range(3):
        # The create request's answer says whether a run exists, whatever the UI then draws (under load its error
        # toast, "Oops. Something went wrong.", came late or in another element than .p-toast: CI, sessions 8, 15).
        with page.expect_response(is_create_flow_run, timeout=60_000) as created:
            page.get_by_role("button", name="Submit").click()
        if created.value.ok or attempt == 2:
            break
        # No run was created and the form is still open: close what error toasts are up and submit again.
        for close in page.get_by_role("button", name="Close").all():
            close.dispatch_event("click")
    answer = created.value
    assert answer.ok, f"the UI's create_flow_run answered {answer.status} three times: {answer.text()[:2000]}"
    try:
        expect(toast).to_be_visible(timeout=60_000)
    except AssertionError:  # the run exists (the answer above); the UI never drew its toast (a fresh clone, once)
        page.goto(f"/runs/flow-run/{answer.json()['id']}")
        settle(page)
        return str(page.url)
    run_name = toast.inner_text().split(" scheduled to start")[0].strip().split("\n")[-1].strip()
    # The form routes back to the deployment page, which then sets its tab (?tab=Runs); a click on the toast
    # during those two navigations is overridden by them. Let them finish, then click, and check.
    page.wait_for_url(re.compile(r"/deployments/deployment/[0-9a-f-]+/?(\?.*)?$"), timeout=60_000)
    settle(page)
    page.wait_for_timeout(500)
    if screenshot:
        shot(page, screenshot)
    flow_run_page = re.compile(r"/runs/flow-run/[0-9a-f-]+")
    for _ in range(3):
        try:
            view = page.get_by_role("button", name="View run")
            if view.count():
                view.first.dispatch_event("click")  # the toast slides: a mouse click can miss, a DOM click cannot
            else:  # the run's link (its name until it starts, when the flow names it) in "Next Run"
                page.get_by_role("link", name=run_name, exact=True).first.click(timeout=10_000)
            page.wait_for_url(flow_run_page, timeout=10_000)
            break
        except PlaywrightTimeoutError:
            continue
    page.wait_for_url(flow_run_page)
    settle(page)
    return str(page.url)


def run_state(page: Page) -> str:
    badge = page.locator(".page-heading-flow-run__meta .state-badge").first
    return badge.inner_text().strip() if badge.count() else ""


def wait_for_state(page: Page, wanted: str, timeout_s: float = RUN_TIMEOUT_S) -> None:
    """Watch the flow run page until its state badge says `wanted`; fail early on another final state."""
    final = {"Completed", "Failed", "Crashed", "Cancelled"}
    deadline = time.monotonic() + timeout_s
    last_reload = time.monotonic()
    while time.monotonic() < deadline:
        state = run_state(page)
        if state == wanted:
            return
        if state in final:
            raise AssertionError(f"flow run ended {state}, expected {wanted} ({page.url})")
        if time.monotonic() - last_reload > 20:  # the page polls by itself; a reload is a fallback
            page.reload()
            last_reload = time.monotonic()
        page.wait_for_timeout(1000)
    raise AssertionError(f"flow run still {run_state(page)!r} after {timeout_s:.0f} s, expected {wanted} ({page.url})")


def wait_for_state_off_page(page: Page, url: str, wanted: str, timeout_s: float = RUN_TIMEOUT_S) -> None:
    """A long run: wait for its final state through the API with the page parked on about:blank (the run page's
    graph, redrawn as it polls, kept Chromium's GPU process at ~65% of a core on a 2-core box, slowing the run it
    watched), then open the run page and wait for its badge to say `wanted`, as a user sees it."""
    from prefect import get_client

    run_id = uuid.UUID(url.rstrip("/").split("/")[-1])
    page.goto("about:blank")
    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while True:
            state = client.read_flow_run(run_id).state
            if state is not None and state.is_final():
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"flow run still {state and state.name!r} after {timeout_s:.0f} s ({url})")
            time.sleep(2)
    page.goto(url)
    settle(page)
    wait_for_state(page, wanted, timeout_s=60)


def open_tab(page: Page, name: str) -> None:
    dismiss_toasts(page)
    page.locator("li.p-tab", has_text=name).first.click()
    settle(page)


def open_subflow(page: Page, name: str) -> None:
    open_tab(page, "Subflow Runs")
    page.get_by_role("link", name=name, exact=True).first.click()
    page.wait_for_url(re.compile(r"/runs/flow-run/[0-9a-f-]+"))
    settle(page)


def open_artifact(page: Page, key: str) -> None:
    """From a flow run's Artifacts tab, open the artifact card named `key`."""
    open_tab(page, "Artifacts")
    dismiss_toasts(page)
    page.get_by_text(key, exact=True).first.click()
    page.wait_for_url(re.compile(r"/artifacts/artifact/[0-9a-f-]+"))
    settle(page)


def table_rows(page: Page) -> list[dict[str, str]]:
    """The rows of a table artifact as shown on its page (header cell -> cell text)."""
    table = page.locator("table").first
    expect(table).to_be_visible()
    headers = [h.inner_text().strip() for h in table.locator("thead th").all()]
    rows = []
    for tr in table.locator("tbody tr").all():
        cells = [c.inner_text().strip() for c in tr.locator("td").all()]
        rows.append(dict(zip(headers, cells, strict=False)))
    return rows


def any_text(page: Page, pattern: str) -> Any:
    return page.get_by_text(re.compile(pattern)).first
