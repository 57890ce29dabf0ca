"""One training over two "nodes" through the real Prefect server: a process work pool with the `train-node`
deployment and one worker per node on its own work queue (node-a, node-b), the `train-fanout` flow starting one
child per queue; torchrun on each (one gloo process), meeting at node 0's c10d store on 127.0.0.1 and a port node 0
picks and publishes. The tiny synthetic store of test_train_flow.py.

Checked: SIGKILL of node 1's torchrun mid-run ends the fan-out Failed naming node 1, node 0 stops too, nothing of
the job is left running; a re-run (through the train deployment's flow with train.nodes 2, which fans out the same
way) resumes from the last checkpoint on both nodes and completes, with one progress artifact at 100% and the table
of nodes.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from eagle3.config import PipelineConfig
from eagle3.draft.synthetic import write_run
from eagle3.store.fsio import read_json
from eagle3.train.launch import read_metrics
from tests.e2e.test_flows import latest_artifact
from tests.e2e.test_scale_out import deployments_module, start_worker
from tests.e2e.test_train_flow import SPEC, config, processes_with

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
QUEUES = ("node-a", "node-b")


@pytest.fixture
def train_node_workers(prefect_server: str) -> Any:
    """The documented set-up on one machine: the `train-node` deployment on a process pool, a worker per node on
    its own queue, and each node's `gpu-<queue>` limit (1 slot: train.nproc 1)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, WorkQueueCreate

    d = deployments_module()
    pool = "train-fanout-test"
    with get_client(sync_client=True) as client:
        d.ensure_work_pool(client, pool, 30)
        for queue in QUEUES:
            client.create_work_queue(**WorkQueueCreate(name=queue).model_dump(exclude_unset=True), work_pool_name=pool)
            client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=f"gpu-{queue}", limit=1))
        spec = next(e for e in d.load_spec()["deployments"] if e["name"] == "train-node")
        d.apply_deployment(client, {**spec, "work_pool": {"name": pool}}, REPO)
    workers = [start_worker(pool, queue) for queue in QUEUES]
    try:
        yield pool
    finally:
        for w in workers:  # the worker and the flow runs it started (its session)
            os.killpg(w.pid, signal.SIGKILL)
            w.wait(timeout=30)
        with get_client(sync_client=True) as client:
            for queue in QUEUES:
                client.delete_global_concurrency_limit_by_name(f"gpu-{queue}")


def kill_node_1_torchrun_after_a_checkpoint(out: Path, killed: list[int]) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if (out / "checkpoints" / "latest.json").exists():
            pids = [p for p in processes_with(str(out / "job-node1.json")) if b"torch.distributed.run" in
                    Path(f"/proc/{p}/cmdline").read_bytes()]  # fmt: skip
            if pids:
                os.kill(pids[0], signal.SIGKILL)
                killed.append(pids[0])
                return
        time.sleep(0.3)


def test_a_killed_node_fails_the_fanout_naming_it_and_a_rerun_resumes_on_both_nodes(
    train_node_workers: str, tmp_path: Path
) -> None:
    from flows.train import train_flow
    from flows.train_fanout import train_fanout_flow

    write_run(tmp_path / "store", tmp_path / "target", SPEC)
    rdzv = {"nodes": 2, "work_queues": list(QUEUES), "rdzv_endpoint": "127.0.0.1", "peer_timeout_s": 60}
    cfg: PipelineConfig = config(tmp_path, max_steps=400, checkpoint_every=2, log_every=1, **rdzv)
    out = tmp_path / "store" / "train"

    killed: list[int] = []
    killer = threading.Thread(target=kill_node_1_torchrun_after_a_checkpoint, args=(out, killed), daemon=True)
    killer.start()
    state = train_fanout_flow(cfg, poll_s=1.0, return_state=True)
    killer.join(timeout=5)
    assert killed, "node 1's torchrun was never seen running"
    assert state.is_failed() and state.message is not None
    assert "node 1" in state.message and "work queue node-b" in state.message, state.message
    deadline = time.monotonic() + 30  # the flow runs reported their end; their processes exit right after
    while processes_with(str(out)):
        assert time.monotonic() < deadline, f"left running: {processes_with(str(out))}"
        time.sleep(0.5)
    stopped_at = read_json(out / "checkpoints" / "latest.json")["step"]
    assert 2 <= stopped_at < 400

    again = config(tmp_path, max_steps=stopped_at + 4, checkpoint_every=2, log_every=1, **rdzv)
    state = train_flow(again, return_state=True)  # the train deployment's flow: train.nodes 2 fans out the same way
    assert state.is_completed(), state.message
    records = read_metrics(out / "metrics.jsonl")
    assert records[-1]["step"] == stopped_at + 4 and records[-1]["start_step"] == stopped_at
    assert (out / "train-node1.log").is_file() and (out / "job-node1.json").is_file()
    progress = latest_artifact("store-train-fanout-progress")
    assert progress.data == 100.0 and f"{stopped_at + 4}/{stopped_at + 4} steps" in (progress.description or "")
    rows = json.loads(latest_artifact("store-train-fanout").data)
    assert [(r["node"], r["work queue"], r["state"]) for r in rows] == [(0, "node-a", "Completed"),
                                                                       (1, "node-b", "Completed")]  # fmt: skip
    assert processes_with(str(out)) == []
