"""A real Prefect server for the end-to-end tests: started once per session by deploy/prefect_server.sh
on a free port, with SQLite under a temporary PREFECT_HOME (not Prefect's per-process temporary
server). PREFECT_API_URL points at it, both for flows run in this process and for `eagle3` subprocesses."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ports import free_port

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "deploy" / "prefect_server.sh"


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """API URL of a session-wide local Prefect server; its log is in $PREFECT_HOME/server.log."""
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

    home = tmp_path_factory.mktemp("prefect-home")
    port = free_port()
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_PORT": str(port),
        # Services the tests do not use: no scheduler, no late-run or worker-heartbeat checks.
        "PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED": "false",
        "PREFECT_SERVER_SERVICES_FOREMAN_ENABLED": "false",
        "PREFECT_SERVER_SERVICES_PAUSE_EXPIRATIONS_ENABLED": "false",
    }
    env.pop("PREFECT_API_URL", None)
    start = subprocess.run(["bash", str(SCRIPT), "start"], env=env, capture_output=True, text=True, timeout=300)
    if start.returncode != 0:
        pytest.fail(f"prefect_server.sh start failed:\n{start.stdout}\n{start.stderr}")
    api_url = f"http://127.0.0.1:{port}/api"
    mp = pytest.MonkeyPatch()
    mp.setenv("PREFECT_API_URL", api_url)  # for `eagle3` subprocesses
    mp.setenv("PREFECT_HOME", str(home))
    mp.delenv("PREFECT_FLOWS_HEARTBEAT_FREQUENCY", raising=False)  # no flow-run heartbeats in tests
    try:
        with temporary_settings(updates={PREFECT_API_URL: api_url, PREFECT_HOME: str(home)}):
            yield api_url
    finally:
        from prefect.logging.handlers import APILogHandler

        APILogHandler().flush()  # send this process's queued run logs while the server is still up
        mp.undo()
        subprocess.run(["bash", str(SCRIPT), "stop"], env=env, capture_output=True, text=True, timeout=60)
