"""Two training "nodes" on localhost: two torchrun launches of one gloo process each, meeting at a c10d
rendezvous on 127.0.0.1 (node 0 hosts the store), over the tiny synthetic store test_train.py uses."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from eagle3.config import TrainConfig
from eagle3.draft.checkpoint import latest_checkpoint
from eagle3.draft.synthetic import SyntheticSpec, write_run
from eagle3.store.paths import TrainPaths
from eagle3.train.job import TrainJob, write_job
from eagle3.train.launch import NodeLaunch, TrainProcess, read_metrics, torchrun_command, train_env
from eagle3.train.rendezvous import free_port, rdzv_id

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SPEC = SyntheticSpec(lengths=tuple([24, 40, 33, 17, 48, 29, 36, 21] * 4))
STEPS = 30  # enough steps after the kill that the job cannot finish before node 1 is gone
LOST_PEER_BOUND_S = 60.0  # a killed peer closes its sockets: gloo fails the survivor's collective at once


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("synthetic")
    write_run(root / "store", root / "target", SPEC)
    return root


def train_cfg(**kw: object) -> TrainConfig:
    base: dict[str, object] = {"batch_tokens": 128, "max_steps": STEPS, "lr": 3e-3, "warmup_steps": 2,
                               "ttt_steps": 3, "draft_vocab_size": 96, "precision": "fp32", "log_every": 1,
                               "checkpoint_every": 2, "loader_threads": 1, "prefetch_batches": 1}  # fmt: skip
    return TrainConfig.model_validate({**base, **kw})


def start(store: Path, out: Path, nproc: int, node: NodeLaunch | None) -> TrainProcess:
    """One node's torchrun through the launcher the train task uses; its output drained by a thread."""
    cfg = train_cfg(nproc=nproc, nodes=node.nodes if node else 1, node_rank=node.node_rank if node else 0)
    job = TrainJob(train=cfg, run_dir=str(store / "store"), model_dir=str(store / "target"), out_dir=str(out),
                   device="cpu")  # fmt: skip
    rank = node.node_rank if node else 0
    write_job(TrainPaths(out).node_job_json(rank), job)
    env = train_env(nproc, {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)})
    cmd = torchrun_command(TrainPaths(out).node_job_json(rank), nproc, node=node)
    proc = TrainProcess(cmd, log_path=TrainPaths(out).node_log(rank), env=env, cwd=REPO).__enter__()
    threading.Thread(target=lambda: list(proc.lines()), daemon=True).start()
    return proc


def two_nodes(store: Path, out: Path) -> list[TrainProcess]:
    endpoint = f"127.0.0.1:{free_port('127.0.0.1')}"
    return [start(store, out, 1, NodeLaunch(2, r, endpoint, rdzv_id(out))) for r in (0, 1)]


def finish(procs: list[TrainProcess], timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    for p in procs:
        assert p.proc is not None
        p.proc.wait(max(1.0, deadline - time.monotonic()))
    for p in procs:
        assert p.returncode == 0, "\n".join(p.tail[-20:])


def losses(out: Path) -> list[float]:
    return [r["loss"] for r in read_metrics(TrainPaths(out).metrics)]


def final_weights(out: Path) -> dict[str, torch.Tensor]:
    ckpt = latest_checkpoint(TrainPaths(out).checkpoints_dir)
    assert ckpt is not None and ckpt.name == f"step-{STEPS:08d}"
    return load_file(ckpt / "model.safetensors")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def our_workers(out: Path) -> list[int]:
    """Processes whose command line names a job file of this training (torchrun and its workers)."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if str(out).encode() in (d / "cmdline").read_bytes():
                    found.append(int(d.name))
            except OSError:
                continue
    return [p for p in found if alive(p)]


@pytest.fixture(scope="module")
def uninterrupted(store: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two nodes training STEPS steps without a fault (both tests compare with it)."""
    out = tmp_path_factory.mktemp("nodes") / "train"
    finish(two_nodes(store, out))
    return out


def test_two_nodes_train_the_loss_curve_of_one_node_with_two_processes(
    store: Path, uninterrupted: Path, tmp_path: Path
) -> None:
    finish([start(store, tmp_path / "one", 2, None)])
    two, one = losses(uninterrupted), losses(tmp_path / "one")
    assert len(two) == STEPS and two == pytest.approx(one, rel=1e-5, abs=1e-6)
    a, b = final_weights(uninterrupted), final_weights(tmp_path / "one")
    assert all(torch.allclose(a[k], b[k], rtol=1e-5, atol=1e-6) for k in b)
    assert not list(TrainPaths(uninterrupted).checkpoints_dir.glob(".*tmp"))  # written whole, by rank 0
    assert our_workers(uninterrupted) == [] and our_workers(tmp_path) == []


def test_a_killed_node_stops_the_other_and_a_rerun_resumes_to_the_uninterrupted_weights(
    store: Path, uninterrupted: Path, tmp_path: Path
) -> None:
    straight = uninterrupted
    out = tmp_path / "killed"
    procs = two_nodes(store, out)
    try:
        deadline = time.monotonic() + 300
        while len(read_metrics(TrainPaths(out).metrics)) < 3:  # past the checkpoint of step 2
            assert time.monotonic() < deadline and all(p.returncode is None for p in procs), "ended early"
            time.sleep(0.1)
        assert procs[1].proc is not None
        os.kill(procs[1].proc.pid, signal.SIGKILL)  # node 1's torchrun (the launcher exec'd it: same pid)
        t0 = time.monotonic()
        assert procs[0].proc is not None
        procs[0].proc.wait(LOST_PEER_BOUND_S)
        stopped_s = time.monotonic() - t0
    finally:
        for p in procs:
            p.stop(grace_s=5)
    assert procs[0].returncode not in (0, None) and stopped_s < LOST_PEER_BOUND_S
    time.sleep(1.0)  # the killed node's worker gets its parent-death signal
    assert our_workers(out) == [], "a process of the killed job is still running"
    done = latest_checkpoint(TrainPaths(out).checkpoints_dir)
    assert done is not None and 2 <= int(done.name.split("-")[1]) < STEPS

    finish(two_nodes(store, out))  # the re-run: same nodes, from the last checkpoint
    assert read_metrics(TrainPaths(out).metrics)[-1]["start_step"] == int(done.name.split("-")[1])
    a, b = final_weights(out), final_weights(straight)
    assert all(torch.equal(a[k], b[k]) for k in b), "resume is not exact"
    assert losses(out) == pytest.approx(losses(straight), abs=1e-6)
    assert our_workers(tmp_path) == []
