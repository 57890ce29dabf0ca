"""Scale-out against a real local Prefect server, with the transformers engine on CPU (8 short chats, 4 shards):

- two servers in one flow run fill the store, each with its own shards, and the store is identical to the one a
  single server made;
- two flow runs sharing one run directory (`extract.share_run_dir`) split the shards by lease with no overlap
  (one is held mid-shard with SIGSTOP, so the split is forced, not left to timing), and the store is identical;
- a flow run killed while it holds a shard's lease: the other flow run, waiting for that shard, takes the lease
  over and extracts it; the store is identical.

"Identical" is byte-for-byte (tests/store_compare.py): every sample file (ids, mask, hidden states) and every
manifest entry. It holds here because each shard is extracted whole by one engine, so the transformers engine
batches the same samples together as in the single-server run, on the same CPU build and thread count.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from eagle3.config import PipelineConfig, load_config
from eagle3.store.lease import lease_path
from eagle3.store.lock import read_owner
from eagle3.store.run_store import RunStore
from tests.deploy_module import deployments_module
from tests.store_compare import store_contents

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
CHATS = [
    ("What is the capital of France?", "Paris."),
    ("Name a colour of the sky.", "Blue."),
    ("What is 3 times 4?", "12."),
    ("Say hello in Spanish.", "Hola."),
    ("Give one word that rhymes with cat.", "Hat."),
    ("What do bees make?", "Honey."),
    ("How many legs has a spider?", "Eight."),
    ("What is the opposite of hot?", "Cold."),
]
SHARDS = [0, 1, 2, 3]


def write_config(tmp: Path, run_dir: Path, *overrides: str) -> Path:
    data = tmp / "chats.jsonl"
    if not data.exists():
        data.write_text(
            "".join(
                json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}) + "\n"
                for q, a in CHATS
            )
        )
    cfg: dict[str, Any] = {
        "run_dir": str(run_dir),
        "model": "demo",
        "data_dir": str(REPO / "data"),
        "stages": ["prepare", "extract"],
        "data": {"dataset": str(data), "max_length": 64, "shard_size": 2},
        "server": {"engine": "transformers", "device": "cpu"},
        "extract": {"shard_retries": 0},
    }
    path = tmp / f"{run_dir.name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    if overrides:
        path.write_text(yaml.safe_dump(load_config(path, list(overrides)).model_dump(mode="json")))
    return path


def prepared_copy(src: Path, dst: Path) -> RunStore:
    """The reference run directory with its prepared data only: a fresh run of the same dataset."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("shards", "run.json", ".lock*", "leases", "dump", "server"))
    return RunStore(dst)


@pytest.fixture(scope="module")
def reference(prefect_server: str, demo_model: Path, tmp_path_factory: pytest.TempPathFactory) -> RunStore:
    """prepare + extract with one server: the store every scaled-out run must reproduce."""
    from flows.pipeline import pipeline

    tmp = tmp_path_factory.mktemp("scale-out")
    state = pipeline(load_config(write_config(tmp, tmp / "one-server")), return_state=True)
    assert state.is_completed(), state.message
    store = RunStore(tmp / "one-server")
    assert [(m.shard, m.status) for m in store.manifests()] == [(s, "complete") for s in SHARDS]
    return store


def test_two_servers_in_one_flow_run_fill_the_run_with_their_own_shards_byte_identical_to_one_server(
    reference: RunStore, tmp_path: Path
) -> None:
    from flows.extract import extract_flow

    store = prepared_copy(reference.root, tmp_path / "two-servers")
    cfg = load_config(write_config(tmp_path, store.root, "stages=[extract]", "server.servers=[{}, {}]"))
    state = extract_flow(cfg, return_state=True)
    assert state.is_completed(), state.message
    summary = state.result()
    assert len(summary.servers) == 2, summary.servers  # both servers extracted shards
    assert sorted(s for shards in summary.servers.values() for s in shards) == SHARDS  # each shard once
    assert summary.extracted == SHARDS and summary.by_other_runs == []
    assert store_contents(store) == store_contents(reference)


def start_extract(config_path: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "run", str(config_path), "--stages", "extract"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def stop_when_leasing(proc: subprocess.Popen[str], store: RunStore, shard: int) -> None:
    """SIGSTOP `proc` as soon as it holds the lease on `shard` (it stays alive, holding the lease)."""
    path = lease_path(store.root, shard)
    deadline = time.monotonic() + 300
    while True:
        assert proc.poll() is None, f"the flow run ended before it leased shard {shard}:\n{proc.stdout.read()}"  # type: ignore[union-attr]
        assert time.monotonic() < deadline, f"no lease on shard {shard} within 300 s"
        try:
            owner = read_owner(path)
        except FileNotFoundError:
            owner = None
        if owner is not None and owner.pid == proc.pid:
            os.kill(proc.pid, signal.SIGSTOP)
            return
        time.sleep(0.02)


def when_complete(store: RunStore, shards: list[int], action: Any) -> threading.Thread:
    """Run `action` a few seconds after `shards` are complete (the other flow run is then waiting for its lease)."""

    def watch() -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            status = {m.shard: m.status for m in store.manifests()}
            if all(status.get(s) == "complete" for s in shards):
                break
            time.sleep(0.2)
        time.sleep(3.0)
        action()

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


def shared_config(tmp_path: Path, store: RunStore) -> tuple[Path, PipelineConfig]:
    path = write_config(tmp_path, store.root, "stages=[extract]", "extract.share_run_dir=true")
    return path, load_config(path)


def test_two_flow_runs_sharing_a_run_directory_split_the_shards_with_no_overlap_byte_identical(
    reference: RunStore, tmp_path: Path
) -> None:
    from flows.extract import extract_flow

    store = prepared_copy(reference.root, tmp_path / "shared")
    path, cfg = shared_config(tmp_path, store)
    first = start_extract(path)
    try:
        stop_when_leasing(first, store, 0)  # the first flow run holds shard 0, frozen
        watcher = when_complete(store, [1, 2, 3], lambda: os.kill(first.pid, signal.SIGCONT))
        second = extract_flow(cfg, return_state=True)  # takes 1, 2, 3; then waits for 0
        watcher.join()
    finally:
        os.kill(first.pid, signal.SIGCONT)
        out, _ = first.communicate(timeout=600)
    assert first.returncode == 0, out[-4000:]
    assert second.is_completed(), second.message
    summary = second.result()
    assert summary.extracted == [1, 2, 3] and summary.by_other_runs == [0]
    assert "extracted here: [0]" in out  # the first flow run's summary log line: only shard 0
    assert not list((store.root / "leases").glob("*.lease"))  # every lease given back
    assert store_contents(store) == store_contents(reference)


def test_a_killed_flow_runs_lease_is_taken_over_by_the_waiting_flow_run_and_the_store_is_byte_identical(
    reference: RunStore, tmp_path: Path
) -> None:
    from flows.extract import extract_flow

    store = prepared_copy(reference.root, tmp_path / "killed")
    path, cfg = shared_config(tmp_path, store)
    first = start_extract(path)
    try:
        stop_when_leasing(first, store, 0)
        watcher = when_complete(store, [1, 2, 3], lambda: os.kill(first.pid, signal.SIGKILL))
        second = extract_flow(cfg, return_state=True)  # waits for shard 0 until its holder dies, then takes it over
        watcher.join()
    finally:
        first.kill()
        first.communicate(timeout=60)
    assert second.is_completed(), second.message
    summary = second.result()
    assert summary.extracted == SHARDS and summary.by_other_runs == []
    assert store_contents(store) == store_contents(reference)


def start_worker(pool: str, queue: str) -> subprocess.Popen[bytes]:
    argv = ["worker", "start", "--pool", pool, "--work-queue", queue, "--type", "process", "--name", f"w-{queue}"]
    return subprocess.Popen(
        [sys.executable, "-m", "prefect", *argv],
        cwd=REPO,
        env={**os.environ, "PREFECT_WORKER_QUERY_SECONDS": "2"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: the flow runs it starts go with it
    )


@pytest.fixture
def two_node_workers(prefect_server: str) -> Any:
    """The documented multi-node set-up on one machine: a process pool with the `extract-node` deployment and one
    worker per "node", each on its own work queue (node-a, node-b)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkQueueCreate
    from prefect.exceptions import ObjectAlreadyExists

    d = deployments_module()
    pool = "scale-out-test"
    with get_client(sync_client=True) as client:
        d.ensure_work_pool(client, pool, 30)
        for queue in ("node-a", "node-b"):  # a test before this one in the session may have made them
            create = WorkQueueCreate(name=queue).model_dump(exclude_unset=True)
            with contextlib.suppress(ObjectAlreadyExists):
                client.create_work_queue(**create, work_pool_name=pool)
        spec = next(e for e in d.load_spec()["deployments"] if e["name"] == "extract-node")
        d.apply_deployment(client, {**spec, "work_pool": {"name": pool}}, REPO)
    workers = [start_worker(pool, queue) for queue in ("node-a", "node-b")]
    try:
        yield pool
    finally:
        for w in workers:  # the worker and the flow runs it started (its session)
            os.killpg(w.pid, signal.SIGKILL)
            w.wait(timeout=30)


def test_the_fanout_flow_runs_one_child_per_node_queue_and_they_fill_the_run_byte_identical(
    reference: RunStore, tmp_path: Path, two_node_workers: str
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    from flows.extract_fanout import extract_fanout_flow

    store = prepared_copy(reference.root, tmp_path / "fanout")
    cfg = load_config(write_config(tmp_path, store.root, "stages=[extract]"))
    state = extract_fanout_flow(cfg, work_queues=["node-a", "node-b"], poll_s=2.0, return_state=True)
    assert state.is_completed(), state.message
    summary = state.result()
    assert [(c.work_queue, c.state) for c in summary.children] == [("node-a", "Completed"), ("node-b", "Completed")]
    extracted = [s for c in summary.children for s in c.extracted]
    assert sorted(extracted) == SHARDS  # every shard by exactly one child
    assert summary.complete == SHARDS and summary.samples == summary.expected == len(CHATS)
    assert store_contents(store) == store_contents(reference)
    with get_client(sync_client=True) as client:
        (progress,) = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["fanout-extract-fanout-progress"])),
            sort=ArtifactSort.CREATED_DESC,
            limit=1,
        )
    assert float(progress.data) == 100.0 and f"{len(CHATS)}/{len(CHATS)} samples" in (progress.description or "")


def test_a_grown_store_fanned_out_over_two_nodes_extracts_only_the_new_shards_once(
    reference: RunStore, tmp_path: Path, two_node_workers: str, demo_model: Path
) -> None:
    """grow x two extraction nodes on one run directory: each night's fan-out extracts exactly the shards its intake
    appended (each by one child), leaves the old files as they were, and the grown store is byte-identical to the
    one-server store of all the rows."""
    from eagle3.data.prepare import prepare
    from flows.extract_fanout import extract_fanout_flow
    from tests.integration.test_intake import snapshot
    from tests.landing import drop

    rows = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]} for q, a in CHATS]
    folder = tmp_path / "grow"
    folder.mkdir()
    drop(folder, "day1.jsonl", rows[:4])
    cfg = load_config(write_config(tmp_path, tmp_path / "grown", "stages=[extract]", f"data.dataset={folder}"))
    store = RunStore(cfg.run_dir)

    def fan_out() -> list[int]:
        state = extract_fanout_flow(cfg, work_queues=["node-a", "node-b"], poll_s=2.0, return_state=True)
        assert state.is_completed(), state.message
        return sorted(s for c in state.result().children for s in c.extracted)

    prepare(cfg, store, demo_model)
    assert fan_out() == [0, 1]
    before = snapshot(store)
    drop(folder, "day2.jsonl", rows[4:])
    assert prepare(cfg, store, demo_model).intakes[-1].shards == [2, 3]
    assert fan_out() == [2, 3]  # only the new shards, each by exactly one child
    assert {k: v for k, v in snapshot(store).items() if k in before} == before  # same bytes, same mtimes
    info = store.read_run_info()
    assert info is not None and [i.new_samples for i in info.intakes] == [4, 4]
    assert store_contents(store) == store_contents(reference)  # parity with one server over all the rows
