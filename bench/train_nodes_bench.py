"""What the train-fanout flow adds around a two-node training, on one CPU machine: seconds from submit to the first
finished step, and to the end, for

    plain      two torchrun launches (one gloo process each) meeting at a c10d rendezvous on 127.0.0.1, started
               directly (eagle3.train.launch.torchrun_command, as the train task starts them)
    fan-out    the train-fanout flow through a real Prefect server started here (temporary PREFECT_HOME, free port),
               the train-node deployment on a process pool and one worker per "node" (queues node-a, node-b),
               each child's train task starting the same torchrun

on the tiny synthetic store of the trainer's tests, passes alternating (plain, fan-out, plain, ...):

    .venv/bin/python bench/train_nodes_bench.py [--steps 20] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from eagle3.config import PipelineConfig  # noqa: E402
from eagle3.draft.synthetic import SyntheticSpec, write_run  # noqa: E402
from eagle3.store.paths import TrainPaths  # noqa: E402
from eagle3.train.job import TrainJob, write_job  # noqa: E402
from eagle3.train.launch import NodeLaunch, TrainProcess, read_metrics, torchrun_command, train_env  # noqa: E402
from eagle3.train.rendezvous import free_port, rdzv_id  # noqa: E402

QUEUES = ("node-a", "node-b")
SPEC = SyntheticSpec(lengths=tuple([24, 40, 33, 17, 48, 29, 36, 21] * 4))


def config(root: Path, steps: int) -> PipelineConfig:
    train = {"batch_tokens": 128, "max_steps": steps, "lr": 3e-3, "warmup_steps": 2, "ttt_steps": 3,
             "draft_vocab_size": 96, "precision": "fp32", "log_every": 1, "checkpoint_every": steps,
             "loader_threads": 1, "prefetch_batches": 1, "rdzv_endpoint": "127.0.0.1", "nodes": 2,
             "work_queues": list(QUEUES)}  # fmt: skip
    return PipelineConfig.model_validate(
        {"run_dir": str(root / "store"), "model": str(root / "target"), "stages": ["train"],
         "server": {"device": "cpu"}, "train": train}
    )  # fmt: skip


def times(out: Path, t0: float, t_end: float) -> tuple[float, float]:
    records = read_metrics(TrainPaths(out).metrics)
    return records[0]["time"] - t0, t_end - t0


def plain(root: Path, steps: int) -> tuple[float, float]:
    cfg = config(root, steps)
    out = Path(cfg.run_dir) / "train"
    endpoint = f"127.0.0.1:{free_port('127.0.0.1')}"
    env = train_env(1, {**os.environ, "PYTHONPATH": str(REPO)})
    t0 = time.time()
    procs = []
    for rank in (0, 1):
        train = cfg.train.model_copy(update={"node_rank": rank})
        job = TrainJob(train=train, run_dir=cfg.run_dir, model_dir=cfg.model, out_dir=str(out), device="cpu")
        write_job(TrainPaths(out).node_job_json(rank), job)
        cmd = torchrun_command(TrainPaths(out).node_job_json(rank), 1, node=NodeLaunch(2, rank, endpoint, rdzv_id(out)))
        procs.append(TrainProcess(cmd, log_path=TrainPaths(out).node_log(rank), env=env, cwd=REPO).__enter__())
    for p in procs:
        for _ in p.lines():
            pass
        assert p.returncode == 0, "\n".join(p.tail)
    return times(out, t0, time.time())


def fanout(root: Path, steps: int) -> tuple[float, float]:
    from flows.train_fanout import train_fanout_flow

    cfg = config(root, steps)
    t0 = time.time()
    state = train_fanout_flow(cfg, poll_s=1.0, return_state=True)
    t_end = time.time()
    assert state.is_completed(), state.message
    return times(Path(cfg.run_dir) / "train", t0, t_end)


def serve(home: Path) -> tuple[str, dict[str, str], list[subprocess.Popen[bytes]]]:
    """A Prefect server (deploy/prefect_server.sh), the pool, queues, deployment and two workers."""
    port = free_port("127.0.0.1")
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_PORT": str(port),
           "PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED": "false"}  # fmt: skip
    env.pop("PREFECT_API_URL", None)
    subprocess.run(["bash", str(REPO / "deploy/prefect_server.sh"), "start"], env=env, check=True, timeout=300)
    api = f"http://127.0.0.1:{port}/api"
    os.environ.update(PREFECT_API_URL=api, PREFECT_HOME=str(home))
    import importlib.util

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkQueueCreate

    spec = importlib.util.spec_from_file_location("eagle3_deployments", REPO / "deploy" / "deployments.py")
    assert spec is not None and spec.loader is not None
    d: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(d)
    with get_client(sync_client=True) as client:
        d.ensure_work_pool(client, "bench", 30)
        for q in QUEUES:
            client.create_work_queue(**WorkQueueCreate(name=q).model_dump(exclude_unset=True), work_pool_name="bench")
        entry = next(e for e in d.load_spec()["deployments"] if e["name"] == "train-node")
        d.apply_deployment(client, {**entry, "work_pool": {"name": "bench"}}, REPO)
    argv = [sys.executable, "-m", "prefect", "worker", "start", "--pool", "bench", "--type", "process"]
    wenv = {**os.environ, "PREFECT_WORKER_QUERY_SECONDS": "2"}
    workers = []
    for q in QUEUES:
        workers.append(
            subprocess.Popen(
                [*argv, "--work-queue", q],
                cwd=REPO,
                env=wenv,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        )
    return api, env, workers


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="train-nodes-bench-") as tmp:
        root = Path(tmp)
        _, env, workers = serve(root / "prefect")
        results: dict[str, list[tuple[float, float]]] = {"plain": [], "fan-out": []}
        try:
            for i in range(args.repeats):
                for name, fn in (("plain", plain), ("fan-out", fanout)):
                    run = root / f"{name}-{i}"
                    write_run(run / "store", run / "target", SPEC)
                    results[name].append(fn(run, args.steps))
                    print(f"{name} pass {i}: first step {results[name][-1][0]:.1f} s, end {results[name][-1][1]:.1f} s",
                          flush=True)  # fmt: skip
        finally:
            from prefect.logging.handlers import APILogHandler

            APILogHandler().flush()  # this process's run logs, while the server is still up
            for w in workers:
                os.killpg(w.pid, signal.SIGKILL)
                w.wait()
            subprocess.run(["bash", str(REPO / "deploy/prefect_server.sh"), "stop"], env=env, timeout=60)
    print(f"\n| two nodes, {args.steps} steps (median of {args.repeats}) | submit -> first step | submit -> end |")
    print("|---|---:|---:|")
    for name, rows in results.items():
        first, end = statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows)
        print(f"| {name} | {first:.1f} s | {end:.1f} s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
