"""The automations `make serve` registers, against the served node (tests/ui/conftest.py):

- the example automation (deploy/automations/retry-failed-shards.yaml), once enabled, turns an
  `eagle3.shard.failed` event from an extraction into a retry-failed run on the event's run directory, and
  ignores the same event from a retry-failed run;
- crash-zombie-runs marks a flow run Crashed when its node dies (worker and flow run killed together, so
  nothing reports a final state): the heartbeats stop and the run stops holding its slots.
"""

from __future__ import annotations

import contextvars
import os
import signal
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("playwright", reason="pip install -e '.[dev]' (make test does)")
from playwright.sync_api import Page, expect

from tests.ui.conftest import Served
from tests.ui.prefect_ui import settle, shot

pytestmark = [pytest.mark.ui, pytest.mark.slow]


def emit_shard_failed(run_dir: Path, flow_name: str) -> None:
    """The event tasks/extract/shards.py emits for a failed shard, as if from a run of the flow `flow_name`. In a
    thread of its own: Playwright's event loop runs in the test's thread, and Prefect's sync-or-async
    functions would hand back coroutines there."""
    context = contextvars.copy_context()  # the fixture's Prefect settings (API URL) live in a context variable
    with ThreadPoolExecutor(1) as pool:
        pool.submit(context.run, _emit_shard_failed, run_dir, flow_name).result(timeout=60)


def _emit_shard_failed(run_dir: Path, flow_name: str) -> None:
    from prefect.events import emit_event
    from prefect.events.worker import EventsWorker

    emit_event(
        event="eagle3.shard.failed",
        resource={
            "prefect.resource.id": f"eagle3.run.{run_dir.name}",
            "prefect.resource.name": run_dir.name,
            "eagle3.run_dir": str(run_dir),
        },
        related=[
            {
                "prefect.resource.id": f"prefect.flow.{uuid.uuid4()}",
                "prefect.resource.role": "flow",
                "prefect.resource.name": flow_name,
            }
        ],
        payload={"shard": 1, "status": "partial", "failed_samples": 1, "first_error": "test", "log": ""},
    )
    EventsWorker.drain_all(timeout=30)


def flow_run_pids(flow_run_id: str) -> list[int]:
    """The processes running this flow run (the worker starts them with PREFECT__FLOW_RUN_ID set)."""
    marker = f"PREFECT__FLOW_RUN_ID={flow_run_id}".encode()
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if marker in (proc / "environ").read_bytes().split(b"\0"):
                    pids.append(int(proc.name))
            except OSError:  # gone, or not ours to read
                continue
    return pids


def node_dies(worker_pid: int, flow_run_pids: list[int]) -> None:
    """Worker and flow run stop at once, as when the machine goes away: freeze all of them first, so none sees
    the other die and reports a final state (a flow run whose worker vanishes exits Crashed by itself)."""
    assert flow_run_pids, "found no process of the flow run"
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        os.killpg(worker_pid, sig)
        for pid in flow_run_pids:
            os.kill(pid, sig)


def retry_runs(client: Any) -> dict[str, Any]:
    """run_dir -> flow run, for the runs of the retry-failed deployment."""
    deployment = client.read_deployment_by_name("retry-failed/retry-failed")
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    runs = client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id])))
    return {r.parameters.get("run_dir"): r for r in runs}


def test_the_example_automation_starts_retry_failed_for_the_run_dir_of_a_failed_shard_event(
    served: Served, page: Page, tmp_path: Path
) -> None:
    from prefect import get_client

    with get_client(sync_client=True) as client:
        (automation,) = client.read_automations_by_name("retry-failed-shards")
        assert not automation.enabled  # registered disabled
        client.resume_automation(automation.id)
    page.goto("/automations")
    settle(page)
    expect(page.get_by_text("crash-zombie-runs")).to_be_visible()
    expect(page.get_by_text("retry-failed-shards")).to_be_visible()
    shot(page, "11-automations")
    try:
        from_retry, from_extract = tmp_path / "from-retry", tmp_path / "from-extract"
        emit_shard_failed(from_retry, "retry-failed")  # must not start another retry (no loop)
        emit_shard_failed(from_extract, "extract")
        deadline = time.monotonic() + 90
        with get_client(sync_client=True) as client:
            while str(from_extract) not in retry_runs(client) and time.monotonic() < deadline:
                time.sleep(1)
            runs = retry_runs(client)
            assert str(from_extract) in runs, "the automation started no retry-failed run within 90 s"
            assert str(from_retry) not in runs
            client.delete_flow_run(runs[str(from_extract)].id)  # its run directory does not exist
    finally:
        with get_client(sync_client=True) as client:
            client.pause_automation(automation.id)


def test_a_run_whose_node_dies_is_marked_crashed_when_its_heartbeats_stop(served: Served, tmp_path: Path) -> None:
    from prefect import get_client

    from eagle3.config import PipelineConfig

    config = PipelineConfig.model_validate(
        {"run_dir": str(tmp_path / "killed"), "stages": ["prepare", "extract"], "data": {"shard_size": 10}}
    ).model_dump(mode="json")
    worker_pid = int((served.home / "worker.pid").read_text())
    try:
        with get_client(sync_client=True) as client:
            deployment = client.read_deployment_by_name("pipeline/pipeline")
            run = client.create_flow_run_from_deployment(deployment.id, parameters={"config": config})
            deadline = time.monotonic() + 180
            while not client.read_flow_run(run.id).state.is_running():  # type: ignore[union-attr]
                assert time.monotonic() < deadline, "the flow run did not start within 180 s"
                time.sleep(1)
            running_seen = time.monotonic()  # at most one poll (1 s) after it started running
            time.sleep(5)  # its first heartbeat goes out as it starts running
            node_dies(worker_pid, flow_run_pids(str(run.id)))
            killed = time.monotonic()
            while True:
                state = client.read_flow_run(run.id).state
                assert state is not None
                if state.is_final():
                    break
                waited = time.monotonic() - killed
                assert waited < 60 + 90, f"still {state.name} {waited:.0f} s after the kill"
                time.sleep(2)
            assert state.type.value == "CRASHED", f"{state.name}: {state.message}"
            assert "crash-zombie-runs" in (state.message or "")
            # Not before the heartbeats were overdue: every heartbeat goes out after the run started running,
            # so the automation (60 s window) can fire no earlier than 60 s after that (minus the 1 s poll).
            assert time.monotonic() - running_seen >= 60 - 1
    finally:
        restart = served.serve("worker")
        assert restart.returncode == 0, restart.stderr
