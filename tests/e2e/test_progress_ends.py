"""A flow run that ends Crashed or Cancelled leaves no live-looking progress: its progress artifact says how it
ended, with the last figures and no ETA, and no task run of it stays Running (tasks/progress.py, ENDS_PROGRESS).
A real flow process killed mid-task, against a real Prefect server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from prefect import flow, get_run_logger, task

from eagle3.progress import Progress
from tasks.progress import ENDS_PROGRESS, TaskProgress, progress_ends_with_run
from tests.e2e.test_flows import latest_artifact

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


@task(name="long-work")
def long_work(key: str) -> None:
    with TaskProgress(get_run_logger(), "long-work", key=key) as report:
        report(Progress("long-work", 50, 200, 50 * 240, 50.0))  # 240 tok/s, ETA 150 s
        time.sleep(600)


@flow(name="long-flow", **ENDS_PROGRESS)
def long_flow(key: str) -> None:
    long_work(key)


def started(key: str) -> subprocess.Popen[bytes]:
    """The flow in a process of its own, once its progress artifact shows the live figures and its task run is
    recorded Running (task run states reach the server as events, a moment later)."""
    script = f"from tests.e2e.test_progress_ends import long_flow; long_flow({key!r})"
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, env={**os.environ},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, "the flow process ended before its task reported"
        try:
            if "ETA 2m30s" in (latest_artifact(key).description or "") and running_tasks(flow_run_of(key).id):
                return proc
        except AssertionError:
            pass  # no artifact yet
        assert time.monotonic() < deadline, "no progress within 120 s"
        time.sleep(0.5)


def flow_run_of(key: str) -> Any:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(latest_artifact(key).flow_run_id)


def running_tasks(flow_run_id: Any) -> list[Any]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    return [r for r in runs if r.state is not None and r.state.is_running()]


def test_a_crashed_runs_progress_says_crashed_with_its_last_figures_and_no_eta(prefect_server: str) -> None:
    proc = started("crash-progress")
    proc.send_signal(signal.SIGTERM)  # the engine marks the run Crashed and runs its on_crashed hooks
    proc.wait(60)
    run = flow_run_of("crash-progress")
    assert run.state.is_crashed(), run.state
    text = latest_artifact("crash-progress").description
    assert text.startswith("Crashed: the flow run ended at 50/200 samples, 240 tok/s"), text
    assert "ETA" not in text and not running_tasks(run.id)


def test_a_cancelled_runs_progress_says_cancelled(prefect_server: str) -> None:
    from prefect.states import Cancelled

    proc = started("cancel-progress")
    proc.kill()  # as a worker cancelling a run: the process goes, then the worker runs on_cancellation hooks
    proc.wait(60)
    run = flow_run_of("cancel-progress")
    assert running_tasks(run.id)  # nothing of the killed process ended its task run
    progress_ends_with_run(long_flow, run, Cancelled())
    text = latest_artifact("cancel-progress").description
    assert text.startswith("Cancelled: the flow run ended at 50/200 samples, 240 tok/s"), text
    assert "ETA" not in text and not running_tasks(run.id)


def test_a_run_whose_node_was_lost_has_its_progress_ended_when_the_next_run_on_the_store_starts(
    prefect_server: str, tmp_path: Path
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.states import Crashed

    from tasks.artifacts import run_key
    from tasks.progress import end_stale_progress

    run_dir = tmp_path / "lost-node"
    key = run_key(run_dir, "train-progress")
    proc = started(key)
    proc.kill()  # node and worker gone: nothing runs a hook
    proc.wait(60)
    run = flow_run_of(key)
    with get_client(sync_client=True) as client:  # what the crash-zombie-runs automation does
        client.set_flow_run_state(run.id, Crashed(message="no heartbeat"), force=True)
    assert "ETA" in latest_artifact(key).description
    assert end_stale_progress(run_dir) == [run.id]  # start_flow calls it as the next run on the store starts
    assert latest_artifact(key).description.startswith("Crashed: the flow run ended at 50/200 samples")
    assert not running_tasks(run.id) and end_stale_progress(run_dir) == []
