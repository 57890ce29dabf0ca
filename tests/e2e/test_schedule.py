"""The schedule fires: the node as `deploy/serve.sh start` leaves it (real Prefect server, its scheduler on and
looking every 2 s, the pool, a process worker), plus a pipeline deployment with a short interval schedule over a
folder of traffic, with synthesize in its stages (the target answers the prompts). Between two scheduled runs new
rows land in the folder: the first run that starts after them answers and takes in exactly the new samples (each
generated once, extracted once, in a new shard) and leaves every old file as it was (same bytes, same mtimes).
run_dir is a template ({model_sha}), filled in by each run. The schedule's anchor_date puts its first tick
seconds after the deployment is applied."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from eagle3.data.synthesize import read_summary
from eagle3.store.run_store import RunStore
from tests.deploy_module import deployments_module
from tests.landing import drop
from tests.ports import free_port

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SERVE = REPO / "deploy" / "serve.sh"
INTERVAL_S = 90  # a run takes ~40 s on 2 cores; rows are dropped in the gap
WAIT_S = 420


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, demo_model: Path) -> Iterator[str]:
    """`deploy/serve.sh start` with the scheduler on; `stop` at the end. Yields the API URL."""
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

    home = tmp_path_factory.mktemp("prefect-home-schedule")
    port = free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_PORT": str(port),
        "PREFECT_API_URL": api_url,
        "EAGLE3_GPUS": "1",
        "PREFECT_WORKER_QUERY_SECONDS": "2",
        "PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED": "true",
        "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "2",
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
            yield api_url
    finally:
        mp.undo()
        subprocess.run(["bash", str(SERVE), "stop"], env=env, capture_output=True, text=True, timeout=120)


def conversation(i: int) -> dict:
    return {"messages": [{"role": "user", "content": f"Name a fruit, number {i}."},
                         {"role": "assistant", "content": f"Fruit {i}: an apple."}]}  # fmt: skip


def runs_of(client: Any, deployment_id: Any) -> list[Any]:
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    return client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])))


def wait_for_run(client: Any, deployment_id: Any, started_after: float, timeout_s: float = WAIT_S) -> Any:
    """The first run of the deployment that started after `started_after` (epoch s), once it is final."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        started = [
            r for r in runs_of(client, deployment_id) if r.start_time and r.start_time.timestamp() > started_after
        ]
        if started:
            run = min(started, key=lambda r: r.start_time)
            if run.state is not None and run.state.is_final():
                return run
        time.sleep(2)
    states = [(r.name, r.state_name, r.expected_start_time) for r in runs_of(client, deployment_id)]
    raise AssertionError(f"no scheduled run started after {started_after} finished within {timeout_s} s: {states}")


def snapshot(store: RunStore) -> dict[str, tuple[bytes, int]]:
    source = store.synthesis_source().prepared_dir.glob("shard-*.arrow")
    files = [*store.prepared_dir.glob("shard-*.arrow"), *(store.root / "shards").rglob("*"),
             *store.synthesized_shard_paths(), *source]  # fmt: skip
    return {str(p): (p.read_bytes(), p.stat().st_mtime_ns) for p in files if p.is_file()}


def shard_task_states(client: Any, flow_run_id: Any) -> dict[str, list[str]]:
    """extract-shard task runs of a flow run (and its extract subflow): name -> state names."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, FlowRunFilterParentFlowRunId

    sub = client.read_flow_runs(
        flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run_id]))
    )
    ids = [flow_run_id, *(r.id for r in sub)]
    out: dict[str, list[str]] = {}
    for r in client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids))):
        if r.name.startswith("extract-shard-"):
            out.setdefault(r.name, []).append(r.state_name)
    return out


def test_a_scheduled_run_after_new_rows_landed_extracts_exactly_them_and_leaves_old_files_untouched(
    node: str, tmp_path: Path, demo_model: Path
) -> None:
    from prefect.client.orchestration import get_client

    traffic = tmp_path / "traffic"
    traffic.mkdir()
    drop(traffic, "day1.jsonl", [conversation(i) for i in range(4)])
    config = {
        "run_dir": str(tmp_path / "runs" / "traffic-{model_sha}"),
        "model": "demo",
        "data_dir": str(REPO / "data"),
        "stages": ["prepare", "synthesize", "extract"],
        "data": {"dataset": str(traffic), "max_length": 128, "shard_size": 4},
        "synthesize": {"max_new_tokens": 8},
        "server": {"engine": "transformers", "device": "cpu"},
        "extract": {"shard_retries": 0},
    }
    d = deployments_module()
    first_tick = datetime.now(UTC) + timedelta(seconds=15)
    spec = {
        "name": "scheduled-intake-test",
        "entrypoint": "flows/pipeline.py:pipeline",
        "work_pool": {"name": "eagle3-gpu"},
        "parameters": {"config": config},
        "concurrency_limit": {"limit": 1, "collision_strategy": "ENQUEUE"},
        # The first tick a few seconds from now, not one interval after the schedule is created (Prefect's default).
        "schedules": [{"interval": INTERVAL_S, "slug": "every-90-s", "anchor_date": first_tick.isoformat()}],
    }
    with get_client(sync_client=True) as client:
        _, deployment_id = d.apply_deployment(client, spec, REPO)
        try:
            first = wait_for_run(client, deployment_id, started_after=0.0)
            assert first.state.is_completed(), first.state.message
            runs = sorted((tmp_path / "runs").iterdir())
            assert len(runs) == 1 and len(runs[0].name) == len("traffic-") + 12  # {model_sha}: 12 hex digits
            store = RunStore(runs[0])
            assert [m.status for m in store.manifests()] == ["complete"]
            before = snapshot(store)

            dropped_at = time.time()
            drop(traffic, "day2.jsonl", [conversation(i) for i in range(4, 7)] + [conversation(0)])  # 3 new, 1 seen
            second = wait_for_run(client, deployment_id, started_after=dropped_at)
            client.pause_deployment(deployment_id)
        finally:
            client.pause_deployment(deployment_id)
        assert second.state.is_completed(), second.state.message
        shard_states = shard_task_states(client, second.id)

    assert sorted((tmp_path / "runs").iterdir()) == runs  # the same store: the template resolves the same way
    assert {k: v for k, v in snapshot(store).items() if k in before} == before  # same bytes, same mtimes
    prepared = store.read_prepared_manifest()
    assert prepared is not None and prepared.shards == [4, 3]
    assert [i.new_samples for i in prepared.intakes] == [4, 3] and prepared.intakes[1].known_samples == 1
    assert prepared.synthesis is not None and list(prepared.intakes[1].files) == [str(traffic / "day2.jsonl")]
    summary = read_summary(store)
    assert summary is not None and summary.generated == 3  # only the new prompts were answered
    new_ids = {s.sample_id for s in store.prepared_samples(1)}
    m = store.read_manifest(1)
    assert m is not None and m.status == "complete" and set(m.samples) == new_ids
    assert shard_states == {"extract-shard-00000": ["Skipped"], "extract-shard-00001": ["Completed"]}  # each once
    info = store.read_run_info()
    assert info is not None and len(info.intakes) == 2
    assert info.run_dir_template == config["run_dir"]
