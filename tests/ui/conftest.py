"""The node as `make serve` leaves it, for the browser tests: a real Prefect server on a free port with SQLite
under a temporary PREFECT_HOME, the pool, limits, deployments and automations of deploy/deployments.py, and
a process worker, all started by deploy/serve.sh; plus Debian's Chromium driven by Playwright (no browser
download: executable_path=/usr/bin/chromium).

Screenshots go to test-output/ui/ (a failing test leaves `FAILED-<test>.png` there), and the server and
worker logs are copied there at the end.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.ports import free_port

REPO = Path(__file__).resolve().parents[2]
SERVE = REPO / "deploy" / "serve.sh"
OUT = REPO / "test-output" / "ui"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@dataclass(frozen=True)
class Served:
    api_url: str
    ui_url: str
    home: Path
    env: dict[str, str]  # what deploy/serve.sh ran with (to start the worker again)

    def serve(self, command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(SERVE), command], env=self.env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="session")
def served(tmp_path_factory: pytest.TempPathFactory, demo_model: Path) -> Iterator[Served]:
    """`deploy/serve.sh start` against a temporary PREFECT_HOME and port; `stop` at the end."""
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

    home = tmp_path_factory.mktemp("prefect-home-ui")
    port = free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_PORT": str(port),
        "PREFECT_API_URL": api_url,
        "EAGLE3_GPUS": "1",
        "EAGLE3_CRASH_AFTER_S": "60",  # the crash test waits this long (two 30 s heartbeats); default 150
        "PREFECT_WORKER_QUERY_SECONDS": "2",  # the worker polls for new runs every 2 s (default 10)
        # Not used here (the re-extraction schedule is inactive; one worker): less CPU on a 2-core runner.
        "PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED": "false",
        "PREFECT_SERVER_SERVICES_FOREMAN_ENABLED": "false",
        "PREFECT_SERVER_SERVICES_PAUSE_EXPIRATIONS_ENABLED": "false",
    }
    start = subprocess.run(["bash", str(SERVE), "start"], env=env, capture_output=True, text=True, timeout=600)
    if start.returncode != 0:
        subprocess.run(["bash", str(SERVE), "stop"], env=env, capture_output=True, text=True, timeout=120)
        pytest.fail(f"deploy/serve.sh start failed ({start.returncode}):\n{start.stdout}\n{start.stderr}")
    mp = pytest.MonkeyPatch()
    mp.setenv("PREFECT_API_URL", api_url)
    mp.setenv("PREFECT_HOME", str(home))
    try:
        with temporary_settings(updates={PREFECT_API_URL: api_url, PREFECT_HOME: str(home)}):
            yield Served(api_url=api_url, ui_url=f"http://127.0.0.1:{port}", home=home, env=env)
    finally:
        mp.undo()
        subprocess.run(["bash", str(SERVE), "stop"], env=env, capture_output=True, text=True, timeout=120)
        OUT.mkdir(parents=True, exist_ok=True)
        for log in ("server.log", "worker.log"):
            if (home / log).exists():
                shutil.copy(home / log, OUT / log)


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed: pip install -e '.[dev]' (make test does)")
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is absent: apt-get install chromium (make test does, via deploy/test_deps.sh)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_FLAGS)
        try:
            yield b
        finally:
            b.close()


FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report = yield
    if report.when == "call":
        item.stash[FAILED] = report.failed
    return report


@pytest.fixture
def page(browser: Any, served: Served, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A fresh page (1400x1000) on the served UI; a screenshot to test-output/ui/ when the test fails."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, base_url=served.ui_url)
    context.set_default_timeout(30_000)
    pg = context.new_page()
    try:
        yield pg
    finally:
        if request.node.stash.get(FAILED, False):
            OUT.mkdir(parents=True, exist_ok=True)
            try:
                pg.screenshot(path=str(OUT / f"FAILED-{request.node.name}.png"), full_page=True)
            except Exception as e:  # a crashed page must not hide the test's own failure
                print(f"no failure screenshot: {e}")
        context.close()


@pytest.fixture(scope="session")
def demo_store_dir(tmp_path_factory: pytest.TempPathFactory, demo_model: Path) -> Path:
    """The converted demo store the integration tests share (tests/integration/demo_facts.py: 12 conversations the
    target answered, ~10 s), built once for the browser tests; a test that trains copies it first."""
    from tests.integration.demo_facts import build_demo_store

    return Path(build_demo_store(tmp_path_factory.mktemp("demo-store"), demo_model).run_dir)
