"""A server never outlives the flow run that launched it (real SGLang on CPU, a real Prefect server):

- SIGKILL of the flow's process mid-extraction: within 10 s no process of its SGLang server is left and the port
  is free; the next run takes the stale lock over (no helper file left), stops an orphan a dead run's record names
  (event `eagle3.server.reaped`), and stores every sample exactly once;
- cancelling the flow run through the Prefect API (a worker runs it, as `make serve` does) stops the server.

The live evaluation's servers are covered by tests/integration/test_server_owner.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from eagle3.config import PipelineConfig
from eagle3.serving import procs
from eagle3.serving.record import ServerRecord, read_record, write_record
from eagle3.store.run_store import RunStore
from tests.e2e.test_reliability import events
from tests.integration.sglang_support import TEXTS, prepared, require_sglang_env, sglang_config, write_prepared
from tests.integration.test_faults_sglang import assert_exactly_once, wait_for
from tests.ports import free_port

pytestmark = [pytest.mark.sglang, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
GONE_WITHIN_S = 10.0
_FLOW = (
    "import sys; from eagle3.config import PipelineConfig; from flows.extract import extract_flow; "
    "extract_flow(PipelineConfig.model_validate_json(open(sys.argv[1]).read()))"
)


def a_store(tmp_path: Path, demo_model: Path, demo_tokenizer: Any) -> tuple[PipelineConfig, RunStore, list[Any]]:
    cfg = sglang_config(tmp_path / "run", demo_model, port=free_port(), max_restarts=0)
    cfg.extract.shard_retries = 0
    samples = prepared(demo_tokenizer, [*TEXTS, TEXTS[2].upper(), TEXTS[2].lower()])  # 8 samples, one shard
    store = RunStore(cfg.run_dir)
    write_prepared(store, demo_model, samples)
    return cfg, store, samples


def serving_record(cfg: PipelineConfig, store: RunStore, owner: subprocess.Popen[Any] | None) -> ServerRecord:
    """The server's record once it serves and two samples are stored."""
    path = Path(cfg.run_dir) / "server" / "server.json"

    def ready() -> bool:
        assert owner is None or owner.poll() is None, "the flow process ended before its server served"
        record = read_record(path)
        stored = len(list(store.shard_dir(0).glob("*.safetensors")))
        return record is not None and record.server is not None and stored >= 2

    wait_for("the server serving and two samples stored", ready, 900, every_s=0.2)
    record = read_record(path)
    assert record is not None and record.port == cfg.server.port
    return record


def family(record: ServerRecord) -> list[int]:
    return sorted(set(procs.group_members(record.pgid)) | set(procs.descendants(record.keeper.pid)) | {record.pgid})


def alive(pids: list[int]) -> list[str]:
    return [f"{p}: {' '.join(procs.cmdline(p))[:200]}" for p in pids if procs.identity(p) and not procs.is_zombie(p)]


def assert_gone_within(record: ServerRecord, pids: list[int], seconds: float) -> float:
    t0 = time.monotonic()
    while (alive(pids) or procs.port_holders(record.port)) and time.monotonic() - t0 < seconds:
        time.sleep(0.1)
    took = time.monotonic() - t0
    assert alive(pids) == [] and procs.port_holders(record.port) == [], (took, alive(pids))
    return took


def test_sigkill_of_the_flow_process_mid_extraction_ends_its_server_and_the_next_run_completes(
    prefect_server: str, tmp_path: Path, demo_model: Path, demo_tokenizer: Any
) -> None:
    require_sglang_env()
    from flows.extract import extract_flow

    cfg, store, samples = a_store(tmp_path, demo_model, demo_tokenizer)
    cfg_path = tmp_path / "config.json"
    cfg_path.write_text(cfg.model_dump_json())
    flow = subprocess.Popen([sys.executable, "-c", _FLOW, str(cfg_path)], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        record = serving_record(cfg, store, flow)
        pids = family(record)
        assert len(alive(pids)) >= 4, alive(pids)  # keeper, SGLang, scheduler, detokenizer
        assert record.owner.pid == flow.pid and record.flow_run_id  # the record names the flow run
        at_kill = len(list(store.shard_dir(0).glob("*.safetensors")))
        flow.send_signal(signal.SIGKILL)
        flow.wait(30)
        took = assert_gone_within(record, pids, GONE_WITHIN_S)
        print(f"server gone {took:.1f} s after SIGKILL of its flow process")
    finally:
        flow.kill()
        flow.wait(30)
    assert at_kill < len(samples)
    assert not (Path(cfg.run_dir) / "server" / "server.json").exists()  # the keeper removed its record

    # An orphan whose keeper died with its owner (as after `kill -9` of both): a process group left running and
    # its record, here an evaluation server's. The next run stops it before launching, and says so.
    orphan = subprocess.Popen(["sleep", "1000"], start_new_session=True)
    try:
        planted = plant_orphan_record(Path(cfg.run_dir) / "eval" / "server-plain" / "server.json", orphan.pid, record)
        state = extract_flow(cfg, return_state=True)
        assert orphan.wait(30) == -signal.SIGTERM
    finally:
        orphan.kill()
        orphan.wait(30)
    assert state.is_completed(), state.message
    assert_exactly_once(store, samples, Path(cfg.run_dir) / "dump")
    assert sorted(p.name for p in store.root.glob(".lock*")) == []  # the stale lock taken over, nothing left
    assert not planted.exists()
    (event,) = events("eagle3.server.reaped", f"eagle3.run.{Path(cfg.run_dir).name}")
    assert event.payload["stopped_pids"] == [orphan.pid] and event.payload["record"] == str(planted)
    assert event.payload["owner_flow_run_id"] == record.flow_run_id


def plant_orphan_record(path: Path, pid: int, like: ServerRecord) -> Path:
    """A record of `pid` (leading its own group, running `sleep 1000`) by the dead owner of `like`."""
    wait_for("the orphan's exec", lambda: procs.cmdline(pid) == ("sleep", "1000"), 30)
    keeper = procs.identity(pid)
    assert keeper is not None
    write_record(path, like.model_copy(update={"pgid": pid, "keeper": keeper, "server": None, "log": str(path)}))
    return path


def test_cancelling_the_flow_run_through_the_api_stops_its_server(
    prefect_server: str, tmp_path: Path, demo_model: Path, demo_tokenizer: Any
) -> None:
    require_sglang_env()
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.client.schemas.objects import StateType
    from prefect.states import Cancelling

    from flows.extract import extract_flow

    cfg, store, _ = a_store(tmp_path, demo_model, demo_tokenizer)
    pool = "owner-cancel-test"
    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name=pool, type="process"), overwrite=True)
        deployment_id = client.create_deployment(
            flow_id=client.create_flow(extract_flow),
            name="owner-cancel",
            entrypoint="flows/extract.py:extract_flow",
            work_pool_name=pool,
            path=str(REPO),
            pull_steps=[{"prefect.deployments.steps.set_working_directory": {"directory": str(REPO)}}],
        )
        run = client.create_flow_run_from_deployment(deployment_id, parameters={"config": cfg.model_dump(mode="json")})
    worker = subprocess.Popen(
        [sys.executable, "-m", "prefect", "worker", "start", "--pool", pool, "--type", "process", "--name", "w-cancel"],
        cwd=REPO, env={**os.environ, "PREFECT_WORKER_QUERY_SECONDS": "2"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        record = serving_record(cfg, store, None)
        pids = family(record)
        assert record.flow_run_id == str(run.id)
        with get_client(sync_client=True) as client:
            client.set_flow_run_state(run.id, Cancelling(), force=True)
        took = assert_gone_within(record, pids, 120)
        print(f"server gone {took:.1f} s after the cancellation")

        def cancelled() -> bool:
            with get_client(sync_client=True) as client:
                state = client.read_flow_run(run.id).state
            return state is not None and state.type == StateType.CANCELLED

        wait_for("the flow run Cancelled", cancelled, 120, every_s=1.0)
    finally:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(30)
