"""Reliability against a real local Prefect server, on copies of one small demo store (6 short samples, 3 shards):

- two runs on one run directory: the second refuses with the lock's message, the first finishes, nothing is corrupted;
- a damaged copy: `eagle3 verify` exits 1 and quarantines, `eagle3 retry` (the retry-failed flow) redoes exactly
  the damaged samples, and verify then exits 0;
- a disk budget that cannot fit: the flow ends Failed before any sample is written, with the event `eagle3.disk.low`;
- `prefect flow-run retry` of a failed extract flow run replays the completed shards (persisted results) and
  re-runs only the failed one.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml

from eagle3.config import PipelineConfig, load_config
from eagle3.store.lock import LOCK_NAME
from eagle3.store.run_store import RunStore
from eagle3.store.verify import QUARANTINE, verify_run

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
CHATS = [
    ("What is the capital of France?", "Paris."),
    ("Name a colour of the sky.", "Blue."),
    ("What is 3 times 4?", "12."),
    ("Say hello in Spanish.", "Hola."),
    ("Give one word that rhymes with cat.", "Hat."),
    ("What do bees make?", "Honey."),
]


def write_config(tmp: Path, run_dir: Path, **sections: dict[str, Any]) -> Path:
    data = tmp / "chats.jsonl"
    if not data.exists():
        with data.open("w") as f:
            for q, a in CHATS:
                f.write(json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}))
                f.write("\n")
    cfg: dict[str, Any] = {
        "run_dir": str(run_dir),
        "model": "demo",
        "data_dir": str(REPO / "data"),
        "stages": ["prepare", "extract"],
        "data": {"dataset": str(data), "max_length": 64, "shard_size": 2},
        "server": {"engine": "transformers", "device": "cpu"},
        "extract": {"shard_retries": 0},
    }
    for key, value in sections.items():
        cfg[key] = {**cfg.get(key, {}), **value}
    path = tmp / f"{run_dir.name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def copy_store(src: Path, dst: Path, *, keep_samples: bool = True) -> RunStore:
    """A copy of the clean store under a new name (prepared data and run.json; sample files if asked)."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".lock*", *(() if keep_samples else ("shards",))))
    return RunStore(dst)


def eagle3(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


def identities(store: RunStore) -> dict[str, tuple[int, int]]:
    """sample file -> (inode, mtime): a file the engine redid is a new file (written elsewhere, renamed in)."""
    return {
        str(p.relative_to(store.root)): (p.stat().st_ino, p.stat().st_mtime_ns)
        for p in sorted((store.root / "shards").rglob("*.safetensors"))
    }


def shard_task_runs(flow_run_id: Any) -> list[Any]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    return [r for r in runs if r.name.startswith("extract-shard-")]


def latest_flow_run(flow_name: str) -> Any:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.client.schemas.sorting import FlowRunSort

    with get_client(sync_client=True) as client:
        (run,) = client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=[flow_name])), sort=FlowRunSort.START_TIME_DESC, limit=1
        )
    return run


def events(name: str, resource_id: str, wait_s: float = 30.0) -> list[Any]:
    """Events of `name` about `resource_id`, waiting for the server's event persister (it flushes every few s)."""
    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter

    flt = EventFilter(event=EventNameFilter(name=[name]), resource=EventResourceFilter(id=[resource_id]))
    deadline = time.monotonic() + wait_s
    while True:
        with get_client(sync_client=True) as client:
            found = client.read_events(filter=flt, limit=50).events
        if found or time.monotonic() > deadline:
            return found
        time.sleep(1.0)


@pytest.fixture(scope="module")
def clean_store(prefect_server: str, demo_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """prepare + extract of six short chats (three shards of two), once; tests work on copies."""
    from flows.pipeline import pipeline

    tmp = tmp_path_factory.mktemp("reliability")
    state = pipeline(load_config(write_config(tmp, tmp / "clean")), return_state=True)
    assert state.is_completed(), state.message
    assert verify_run(RunStore(tmp / "clean")).clean
    return tmp / "clean"


def test_a_second_run_on_a_locked_run_directory_refuses_and_nothing_is_corrupted(
    clean_store: Path, tmp_path: Path
) -> None:
    from flows.extract import extract_flow

    store = copy_store(clean_store, tmp_path / "shared", keep_samples=False)
    config_path = write_config(tmp_path, store.root)
    cfg = load_config(config_path, ["stages=[extract]"])
    first = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "run", str(config_path), "--stages", "extract"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    stopped = False
    try:
        deadline = time.monotonic() + 300
        while not (store.root / LOCK_NAME).exists():
            assert first.poll() is None, f"the first run ended before it locked the store:\n{first.stdout.read()}"  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "the first run did not lock the store within 300 s"
            time.sleep(0.05)
        os.kill(first.pid, signal.SIGSTOP)  # hold the first run mid-extraction (its flock stays held)
        stopped = True
        holder = json.loads((store.root / LOCK_NAME).read_text())
        assert holder["pid"] == first.pid and holder["purpose"] == "extract" and holder["flow_run_id"]

        second = extract_flow(cfg, return_state=True)
        assert second.is_failed()
        message = second.message or ""
        assert "is in use: locked by" in message and f"pid {first.pid}" in message
        assert f"(extract, flow run {holder['flow_run_id']})" in message and "alive" in message
        assert json.loads((store.root / LOCK_NAME).read_text())["token"] == holder["token"]  # not taken over
    finally:
        if stopped:
            os.kill(first.pid, signal.SIGCONT)
        out, _ = first.communicate(timeout=600)
    assert first.returncode == 0, out[-4000:]
    assert not (store.root / LOCK_NAME).exists()  # released
    report = verify_run(store)
    assert report.clean and report.ok_count == 6 and report.missing_count == 0
    assert [(m.shard, m.status, len(m.samples)) for m in store.manifests()] == [(s, "complete", 2) for s in range(3)]


def test_verify_and_retry_repair_a_damaged_copy_redoing_only_the_damaged_samples(
    clean_store: Path, tmp_path: Path
) -> None:
    store = copy_store(clean_store, tmp_path / "damaged")
    truncated = sorted(store.shard_dir(0).glob("*.safetensors"))[1]
    corrupt = sorted(store.shard_dir(2).glob("*.safetensors"))[0]
    truncated.write_bytes(truncated.read_bytes()[:-100])
    data = bytearray(corrupt.read_bytes())
    data[-50] ^= 0x01  # one bit of a hidden state: only the checksum can tell
    corrupt.write_bytes(bytes(data))
    before = identities(store)

    found = eagle3("verify", str(store.root))
    assert found.returncode == 1, found.stdout + found.stderr
    assert "2 bad" in found.stdout
    assert sorted(p.name for p in (store.root / QUARANTINE).rglob("*.safetensors")) == sorted(
        [truncated.name, corrupt.name]
    )
    assert [(m.shard, m.status) for m in store.manifests()] == [(0, "partial"), (1, "complete"), (2, "partial")]
    status = eagle3("status", str(store.root))
    assert "failed shards" in status.stdout and "lock: free" in status.stdout

    retried = eagle3("retry", str(store.root))
    assert retried.returncode == 0, retried.stdout[-4000:] + retried.stderr[-4000:]
    after = identities(store)
    damaged = {str(p.relative_to(store.root)) for p in (truncated, corrupt)}
    assert after.keys() == before.keys()
    assert {k for k in after if after[k] != before[k]} == damaged  # the engine redid exactly those two
    run = latest_flow_run("retry-failed")
    assert run.state.is_completed()
    assert sorted(r.name for r in shard_task_runs(run.id)) == ["extract-shard-00000", "extract-shard-00002"]

    clean = eagle3("verify", str(store.root))
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "6 sound, 0 bad" in clean.stdout.replace("\n", " ")


def test_a_disk_budget_that_cannot_fit_fails_the_flow_before_writing_with_a_disk_low_event(
    clean_store: Path, tmp_path: Path
) -> None:
    from flows.extract import extract_flow

    store = copy_store(clean_store, tmp_path / "nodisk", keep_samples=False)
    cfg = load_config(write_config(tmp_path, store.root), ["stages=[extract]", "disk.reserve_min_gb=1000000"])
    state = extract_flow(cfg, return_state=True)
    assert state.is_failed()
    message = state.message or ""
    assert "not enough disk: the run (shards [0, 1, 2]) needs" in message and "disk.reserve_min_gb=1e+06" in message
    assert "Free space on that filesystem" in message  # what to do
    assert list(store.root.glob("shards/**/*")) == []  # no sample file, no manifest
    assert shard_task_runs(state.state_details.flow_run_id) == []  # no shard was started
    assert not (store.root / LOCK_NAME).exists()

    (event,) = events("eagle3.disk.low", "eagle3.run.nodisk")
    assert event.payload["where"] == "store" and event.payload["ok"] is False
    assert event.payload["need_bytes"] > 0 and event.payload["reserve_bytes"] >= 1e15
    assert event.payload["available_bytes"] == 0 and event.payload["free_bytes"] > 0


def test_prefect_flow_run_retry_replays_completed_shards_and_reruns_only_the_failed_one(
    clean_store: Path, tmp_path: Path
) -> None:
    from flows.extract import extract_flow

    store = copy_store(clean_store, tmp_path / "flaky", keep_samples=False)
    cfg: PipelineConfig = load_config(write_config(tmp_path, store.root), ["stages=[extract]"])
    good = store.read_prepared_shard(1)
    broken = good.to_pydict()
    broken["input_ids"][0] = [1, 2, 10**6]  # a token id past the vocabulary: the engine rejects this sample
    broken["loss_mask"][0] = [0, 1, 1]
    broken["num_tokens"][0] = 3
    store.write_prepared_shard(1, pa.Table.from_pydict(broken, schema=good.schema))

    first = extract_flow(cfg, return_state=True)
    assert first.is_failed() and "shard 1" in (first.message or "")
    flow_run_id = first.state_details.flow_run_id
    assert [(m.shard, m.status) for m in store.manifests()] == [(0, "complete"), (1, "partial"), (2, "complete")]
    store.write_prepared_shard(1, good)  # the cause is fixed; now retry that very flow run
    before = identities(store)

    retry = subprocess.run(
        [sys.executable, "-m", "prefect", "flow-run", "retry", str(flow_run_id), "--entrypoint",
         "flows/extract.py:extract_flow"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert retry.returncode == 0, retry.stdout[-4000:] + retry.stderr[-4000:]
    assert "completed successfully" in retry.stdout
    after = identities(store)
    assert {k for k in after if after.get(k) != before.get(k)} == {
        str(store.sample_path(1, s.sample_id).relative_to(store.root)) for s in store.prepared_samples(1)[:1]
    }  # only the sample that had failed was extracted
    attempts: dict[str, list[str]] = {}  # task run name -> state names over both attempts of the flow run
    for r in shard_task_runs(flow_run_id):
        attempts.setdefault(r.name, []).append(r.state.name)
    assert {name: sorted(states) for name, states in attempts.items()} == {
        "extract-shard-00000": ["Cached", "Completed"],  # ran in the first attempt, replayed in the retry
        "extract-shard-00001": ["Completed", "Failed"],  # failed, then ran again
        "extract-shard-00002": ["Cached", "Completed"],
    }
    assert verify_run(store).clean

    (failed,) = events("eagle3.shard.failed", "eagle3.run.flaky")
    assert failed.payload["shard"] == 1 and failed.payload["status"] == "partial"
    assert failed.payload["failed_samples"] == 1 and "token id out of range" in failed.payload["first_error"]
    assert failed.resource["eagle3.run_dir"] == str(store.root.resolve())
    assert any(r.role == "flow" and r.get("prefect.resource.name") == "extract" for r in failed.related)
    (completed,) = events("eagle3.run.completed", "eagle3.run.flaky")
    assert completed.payload["samples"] == completed.payload["expected"] == 6
