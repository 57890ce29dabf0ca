"""Runs left RUNNING (issue 34): every server deploy/prefect_server.sh starts, `make demo`'s included, gets the
crash-zombie-runs automation, and every flow run started in the project beats every 30 s (prefect.toml), so a
flow run whose process is SIGKILLed is marked Crashed within the automation's window instead of staying
RUNNING. A five-line flow in a subprocess stands in for `eagle3 run`'s process (same in-process engine, same
project directory, a second to start instead of a model load)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ports import free_port

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "deploy" / "prefect_server.sh"
CRASH_AFTER_S = 60  # the shortest window allowed: two 30 s heartbeats
FLOW = """
import time
from prefect import flow
@flow(name="crash-probe")
def crash_probe() -> None:
    print("running", flush=True)
    time.sleep(600)
crash_probe()
"""


@pytest.fixture(scope="module")
def demo_like_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A server started the way `make demo` starts one (deploy/prefect_server.sh start, no `make serve`)."""
    home = tmp_path_factory.mktemp("prefect-home-crash")
    port = free_port()
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_PORT": str(port),
           "EAGLE3_CRASH_AFTER_S": str(CRASH_AFTER_S), "EAGLE3_STARTED_BY": "make demo",
           "PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED": "false"}  # fmt: skip
    env.pop("PREFECT_API_URL", None)
    env.pop("PREFECT_FLOWS_HEARTBEAT_FREQUENCY", None)  # prefect.toml's 30 s, as in a plain shell
    start = subprocess.run(["bash", str(SCRIPT), "start"], env=env, capture_output=True, text=True, timeout=300)
    try:
        assert start.returncode == 0, start.stdout + start.stderr
        assert "automation     crash-zombie-runs: " in start.stdout
        yield {**env, "PREFECT_API_URL": f"http://127.0.0.1:{port}/api"}
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop"], env=env, capture_output=True, text=True, timeout=60)


def test_a_sigkilled_flow_run_on_make_demos_server_is_marked_crashed(demo_like_server: dict[str, str]) -> None:
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName

    proc = subprocess.Popen([sys.executable, "-c", FLOW], cwd=REPO, env=demo_like_server, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"running"
        time.sleep(5)  # the first heartbeat goes out when the run starts
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    with SyncPrefectClient(demo_like_server["PREFECT_API_URL"]) as client:
        flt = FlowFilter(name=FlowFilterName(any_=["crash-probe"]))
        deadline = time.monotonic() + CRASH_AFTER_S + 120  # the window, plus the trigger service's evaluation
        while True:
            (run,) = client.read_flow_runs(flow_filter=flt)
            assert run.state is not None
            if run.state.is_final() or time.monotonic() > deadline:
                break
            time.sleep(5)
    assert run.state.name == "Crashed", f"{run.state.name}: {run.state.message}"
    assert "crash-zombie-runs" in (run.state.message or "")
