"""The trainer as a child process: torchrun's command line, its environment, its log, its stop.

    job = TrainJob(...); write_job(out / "job.json", job)
    with TrainProcess(torchrun_command(out / "job.json", nproc=8), log_path=out / "train.log") as proc:
        # several nodes: torchrun_command(..., node=NodeLaunch(nodes, node_rank, endpoint, rdzv_id)) on each
        for line in proc.lines():          # every line is also appended to train.log
            ...
    proc.returncode

torchrun dies with its parent and each worker with torchrun (PR_SET_PDEATHSIG on Linux: torchrun puts
every worker in a session of its own, so a group signal would not reach them), and `stop()` (or leaving
the `with` block early) sends SIGTERM, waits, then SIGKILL: a cancelled or crashed flow run never leaves a
trainer holding GPUs. A worker that raises leaves its exception in torchrun's error file (the worker's `@record`;
torchrun copies the first failed rank's file to TORCHELASTIC_ERROR_FILE, beside the log): `proc.worker_error()`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3.config import TrainConfig
from eagle3.draft.checkpoint import latest_checkpoint, read_state
from eagle3.lifetime import die_with_parent
from eagle3.store.paths import TrainPaths

RDZV_JOIN_TIMEOUT_S = 900  # how long the first node waits for the last to join (model loading, a slow worker start)


@dataclass(frozen=True)
class NodeLaunch:
    """This node's place in a multi-node training: `nodes` torchrun launches meet at `endpoint` (host:port, node
    0's c10d store) under the rendezvous id `rdzv_id` (the same on every node)."""

    nodes: int
    node_rank: int
    endpoint: str
    rdzv_id: str


def torchrun_command(
    job_path: Path, nproc: int, *, node: NodeLaunch | None = None, python: str = sys.executable
) -> list[str]:
    """torchrun's command line, the one place it is spelled. One node (`node` None): --standalone picks a free
    rendezvous port, so two runs never collide. Several: a c10d rendezvous at node 0, which hosts its store
    (is_host, so two "nodes" on one machine never both try to), a bounded wait for the others to join, and no
    restarts: a worker that fails, or a peer lost, ends this node's torchrun, and the flow re-runs the whole job
    from the last checkpoint. Started through this module's `__main__`, which arms the parent-death signal and
    execs torchrun."""
    head = [python, "-m", "eagle3.train.launch", python, "-m", "torch.distributed.run"]
    if node is None:
        where = ["--standalone"]
    else:
        conf = f"is_host={int(node.node_rank == 0)},join_timeout={RDZV_JOIN_TIMEOUT_S}"
        where = ["--nnodes", str(node.nodes), "--node_rank", str(node.node_rank), "--rdzv_backend", "c10d",
                 "--rdzv_endpoint", node.endpoint, "--rdzv_id", node.rdzv_id, "--rdzv_conf", conf,
                 "--max_restarts", "0"]  # fmt: skip
    return [*head, *where, "--nproc_per_node", str(nproc), "-m", "eagle3.train.worker", str(job_path)]


def train_env(
    nproc: int, base: Mapping[str, str], compile_cache: Path | None = None, error_path: Path | None = None
) -> dict[str, str]:
    """The workers' environment: unbuffered output (or the log arrives at exit), a CPU thread share per worker
    (torchrun sets OMP_NUM_THREADS=1 otherwise, which makes a CPU run crawl), and NCCL's async error handling, so
    a collective that outlives train.peer_timeout_s (a peer node gone) aborts the process instead of hanging.
    `compile_cache`: torch.compile's cache (TrainPaths.inductor_cache): kept with the training, so a resume skips
    the minutes of cold compilation (240 s for an 8B-shaped draft; 3.5 s warm). One exported by the caller wins.
    `base`: the caller's environment (the train task passes its os.environ), which the workers inherit.
    `error_path`: torchrun's TORCHELASTIC_ERROR_FILE (error_file(log): the failed worker's exception, read back by
    TrainProcess.worker_error)."""
    env = dict(base)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    if compile_cache is not None:
        env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(compile_cache))
    if error_path is not None:
        env["TORCHELASTIC_ERROR_FILE"] = str(error_path.resolve())
    return env


def error_file(log_path: Path) -> Path:
    """Where torchrun leaves the exception of the first worker that failed, beside its log: train.error.json."""
    return log_path.with_suffix(".error.json")


def read_worker_error(path: Path) -> str | None:
    """The failed worker's exception, `TrainError: ...` (type and message, as torch's ErrorHandler wrote it), from
    torchrun's error file; None when there is none (a worker killed by a signal writes nothing)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    message = data.get("message") if isinstance(data, dict) else None
    if isinstance(message, dict):  # {"message": {"message": "Type: text", "extraInfo": {...}, "errorCode": N}}
        message = message.get("message")
    text = str(message or "").strip()
    return text or None


class TrainProcess:
    def __init__(self, cmd: list[str], *, log_path: Path, env: dict[str, str] | None = None, cwd: Path | None = None):
        self.cmd, self.log_path, self.env, self.cwd = cmd, Path(log_path), env, cwd
        self.error_file = error_file(self.log_path)  # where train_env(..., error_file=) has torchrun write
        self.proc: subprocess.Popen[str] | None = None
        self.tail: list[str] = []  # the last lines, for error messages

    def __enter__(self) -> TrainProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.error_file.unlink(missing_ok=True)  # a resumed launch's error is its own
        self.proc = subprocess.Popen(
            self.cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            env=self.env,
            cwd=self.cwd,
            start_new_session=True,  # its own process group, so stop() can reach it as a group
        )
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def lines(self) -> Iterator[str]:
        """The merged stdout/stderr, line by line, until the process closes it."""
        assert self.proc is not None and self.proc.stdout is not None
        with open(self.log_path, "a", encoding="utf-8") as log:
            for line in self.proc.stdout:
                log.write(line)
                log.flush()
                self.tail = [*self.tail[-39:], line.rstrip("\n")]
                yield line.rstrip("\n")
        self.proc.wait()

    def worker_error(self) -> str | None:
        """The exception of the first worker that failed in this launch (`ValueError: ...`), or None."""
        return read_worker_error(self.error_file)

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM the group (torchrun forwards it and checkpoints are atomic), then SIGKILL after grace_s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(wait_s)
                return
            except subprocess.TimeoutExpired:
                continue


class MetricsTail:
    """New training records of metrics.jsonl since the last call (complete lines only: the trainer appends).
    `heldout=True`: the held-out lines instead ({"step", "heldout", "time"}, one per checkpoint)."""

    def __init__(self, path: Path, *, heldout: bool = False):
        self.path, self.offset, self.heldout = Path(path), 0, heldout

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        self.offset += end
        records = (json.loads(line) for line in data[:end].splitlines() if line.strip())
        return [r for r in records if ("heldout" in r) == self.heldout]


def _last_of_each_step(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_step = {int(rec["step"]): rec for rec in records}
    return [by_step[s] for s in sorted(by_step)]


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All training records, keeping the last one of each step (a resumed run rewrites the steps after its
    checkpoint)."""
    return _last_of_each_step(MetricsTail(path).read())


def read_heldout_metrics(path: Path) -> list[dict[str, Any]]:
    """The held-out records (one per checkpoint, train.heldout_fraction > 0), the last one of each step."""
    return _last_of_each_step(MetricsTail(path, heldout=True).read())


def finished_checkpoint(out_dir: Path, cfg: TrainConfig) -> Path | None:
    """The latest checkpoint if it is the last step of a training with this length (done), else None."""
    ckpt = latest_checkpoint(TrainPaths(out_dir).checkpoints_dir)
    if ckpt is None:
        return None
    state = read_state(ckpt)
    saved = state.get("config", {})
    same_length = (saved.get("max_steps"), saved.get("epochs")) == (cfg.max_steps, cfg.epochs)
    return ckpt if same_length and state["step"] >= state["total_steps"] else None


if __name__ == "__main__":  # python -m eagle3.train.launch CMD...: exec CMD, dying with our parent
    die_with_parent()
    if os.getppid() == 1:  # the parent died before prctl took effect
        sys.exit(1)
    os.execvp(sys.argv[1], sys.argv[1:])
