"""train: torchrun as a child process (eagle3.train.launch) while holding the `gpu` concurrency limit.

Its log streams into the task's log as printed (and `<run_dir>/train/train.log`); metrics.jsonl, never the log,
feeds the progress artifact (steps, tok/s, ETA) as they come, and every `TABLE_EVERY_S` plus at the end the
per-TTT-step table and the curves (a PNG, on disk and inline). Cancelling the flow run stops the trainer
(SIGTERM, then SIGKILL); the next run resumes from the last atomic checkpoint. A finished training is not launched
again. With train.nodes > 1 the task is one node's torchrun (tasks/train_fanout.py starts one per node): job and
log per node (`job-nodeN.json`, `train-nodeN.log`), one metrics.jsonl and checkpoints/ written by global rank 0.
"""

from __future__ import annotations

import base64
import math
import os
import time
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.concurrency.sync import concurrency
from pydantic import BaseModel

from eagle3.config import PipelineConfig
from eagle3.draft.checkpoint import read_state
from eagle3.progress import Progress
from eagle3.release.promote import current_link, pointed
from eagle3.release.retrain import TrainPlan, archive_training, plan_training
from eagle3.store.paths import RunPaths, TrainPaths
from eagle3.train.job import TrainJob, read_job, write_job
from eagle3.train.launch import (
    MetricsTail,
    TrainProcess,
    error_file,
    finished_checkpoint,
    read_metrics,
    torchrun_command,
    train_env,
)
from eagle3.train.plot import ttt_table, write_curves
from eagle3.train.rendezvous import node_launch
from tasks.artifacts import markdown_artifact, method_key, table_artifact
from tasks.progress import TaskProgress

GPU_LIMIT = "gpu"  # the global concurrency limit deploy/deployments.py sizes to the node
TABLE_EVERY_S = 120.0


class TrainFailedError(RuntimeError):
    """torchrun exited non-zero. The first line is the failed worker's own exception (`TrainError: ...`, read from
    torchrun's error file) when it raised one, the second how torchrun exited and where the whole log is; without a
    worker exception (killed by a signal), torchrun's exit and the log's last lines."""

    def __init__(self, message: str, worker_error: str | None = None):  # (message,): pickles as an exception does
        super().__init__(message)
        self.worker_error = worker_error
        self.relays = worker_error is not None  # its message is the worker's: tasks/failure.py shows it as it is

    @classmethod
    def of_launch(
        cls, code: int | None, log_path: Path, tail: list[str], worker_error: str | None, where: str = ""
    ) -> TrainFailedError:
        exit_line = f"torchrun exited with {code}{where}; whole log: {log_path.resolve()}"
        if worker_error:
            return cls(f"{worker_error}\n{exit_line}", worker_error)
        return cls(f"{exit_line}; last lines:\n" + "\n".join(tail[-15:]))


class TrainSummary(BaseModel):
    out_dir: str
    checkpoint: str
    step: int
    total_steps: int
    launched: bool  # False: the training was already finished
    last_metrics: dict[str, Any]
    waiting: bool = False  # the store grew by < train.min_new_tokens: no new training (eagle3/release/retrain.py)
    reason: str = ""  # why this training ran, resumed, was done already or waits


def train_dir(config: PipelineConfig) -> Path:
    """train.method's training directory (eagle3/store/paths.py MethodPaths)."""
    return RunPaths(config.run_dir).method(config.train.method).train.root


def check_inputs(config: PipelineConfig) -> None:
    run = RunPaths(config.run_dir)
    for path in (run.run_json, run.vocab_map_path, run.index_path):
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} is missing: train reads the store and what convert builds; run the stages "
                "extract and convert first (stages: [..., extract, convert, train])"
            )


class TrainReporter:
    """metrics.jsonl -> the progress artifact, and (throttled) the TTT table and the curves."""

    def __init__(self, config: PipelineConfig, out: Path, logger: Any):
        self.config, self.out, self.logger = config, out, logger
        self.paths = TrainPaths(out)
        # the worker's own lines carry the steps into the log; from metrics.jsonl only the artifact, the heartbeat
        # of a silent worker and the final line
        self.progress = TaskProgress(
            logger, "train", key=method_key(config.run_dir, config.train.method, "train-progress"), unit="steps",
            log_every_s=math.inf,
        )
        self.tail = MetricsTail(self.paths.metrics)
        self.t0 = time.monotonic()
        self.tokens = 0
        self.last: dict[str, Any] = {}
        self.last_table = time.monotonic()

    def poll(self) -> None:
        for rec in self.tail.read():
            if not self.last:  # time from the start of the first window, not from the launch (imports, loading)
                self.t0 = time.monotonic() - rec["tokens"] / max(rec["tokens_per_s"], 1e-9)
            self.last = rec
            self.tokens += rec["tokens"]
            elapsed = time.monotonic() - self.t0
            skipped = rec.get("start_step", 0)
            self.progress(Progress("train", rec["step"], rec["total_steps"], self.tokens, elapsed, skipped=skipped))
        if self.last and time.monotonic() - self.last_table >= TABLE_EVERY_S:
            self.publish()

    def publish(self) -> None:
        """The TTT table of the latest record and the curves so far (new versions of the same keys); node 0's alone
        when several nodes train (they read the same metrics.jsonl)."""
        self.last_table = time.monotonic()
        if self.config.train.node_rank != 0:
            return
        records = read_metrics(self.paths.metrics)
        if not records:
            return
        last = records[-1]
        try:
            table_artifact(
                method_key(self.config.run_dir, self.config.train.method, "train-metrics"),
                ttt_table(last),
                f"Step {last['step']}/{last['total_steps']}: loss {last['loss']:.4f}, "
                f"{last['tokens_per_s']:.0f} tok/s, data wait {100 * last['data_wait_frac']:.1f}% of step time",
            )
            png = write_curves(records, self.paths.curves)
            markdown_artifact(
                method_key(self.config.run_dir, self.config.train.method, "train-curves"),
                f"![training curves](data:image/png;base64,{base64.b64encode(png).decode()})\n\n"
                f"`{self.paths.curves.resolve()}`; TensorBoard: `tensorboard --logdir {self.paths.tensorboard_dir}`",
                f"Training curves to step {last['step']}",
            )
        except Exception as e:  # a view of the training; never fail it
            self.logger.warning("train artifacts: %s", e)


def node_gpu_limit(work_queue: str | None) -> str:
    """The concurrency limit of one node's GPUs: `gpu` on a single node; `gpu-<queue>` for the node whose worker
    takes the work queue `work_queue` (one Prefect server sees every node, so one `gpu` limit would be shared)."""
    return GPU_LIMIT if work_queue is None else f"{GPU_LIMIT}-{work_queue}"


def hold_gpus(nproc: int, limit: str = GPU_LIMIT) -> Any:
    """The `limit`'s slots for the run's processes; clear error when the node's limit is smaller."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        try:
            size = client.read_global_concurrency_limit_by_name(limit).limit
        except Exception:  # no such limit (a bare local server): nothing to hold
            size = None
    if size is not None and nproc > size:
        raise ValueError(
            f"train.nproc={nproc} but the global concurrency limit {limit!r} has {size} slots, so the run "
            f"would wait forever; lower train.nproc or raise the limit (`python deploy/deployments.py apply "
            f"--gpus {nproc}`)"
        )
    return concurrency(limit, occupy=nproc, strict=False)


@task(name="train", retries=0, cache_policy=NO_CACHE)
def train_task(
    config: PipelineConfig, model_dir: str, rendezvous_token: str | None = None, gpu_limit: str = GPU_LIMIT
) -> TrainSummary:
    """Train the draft under torchrun (train.nproc processes) on `config.train.device`, resuming if stopped.
    With train.nodes > 1 this is node train.node_rank's share (the train-fanout flow starts one per node):
    `rendezvous_token` names the launch whose rendezvous node 0 publishes (eagle3/train/rendezvous.py), and
    `gpu_limit` is this node's concurrency limit."""
    logger = get_run_logger()
    node = config.train.node_rank
    out = train_dir(config)
    check_inputs(config)
    plan = plan_training(Path(config.run_dir), config.train)
    logger.info("train: %s (%s)", plan.action, plan.reason)
    if plan.action in ("done", "wait"):
        done = finished_checkpoint(out, config.train)
        assert done is not None  # plan_training found it
        reporter = TrainReporter(config, out, logger)
        reporter.poll()
        reporter.publish()
        waiting = plan.action == "wait"
        return summary(out, done, launched=False, last=reporter.last, waiting=waiting, reason=plan.reason)
    if plan.archive and node == 0:  # one node moves the finished training of the smaller store away
        archived = archive_training(Path(config.run_dir), config.train.method)
        logger.info("train: the finished training of the smaller store moved to %s", archived)
    reporter = TrainReporter(config, out, logger)
    job = new_job(config, model_dir, plan, out)
    paths = TrainPaths(out)
    job_path, log_path = paths.node_job_json(node), paths.node_log(node)
    write_job(job_path, job)
    nproc = config.train.nproc
    launch = node_launch(config.train, out, rendezvous_token)  # node 0 publishes its port; the others wait for it
    cmd = torchrun_command(job_path, nproc, node=launch)
    logger.info("train: %s (log: %s)", " ".join(cmd), log_path)
    with (
        reporter.progress,
        hold_gpus(nproc, gpu_limit),
        TrainProcess(
            cmd, log_path=log_path, env=train_env(nproc, os.environ, paths.inductor_cache(node), error_file(log_path))
        ) as proc,
    ):
        for line in proc.lines():  # what the worker prints, as it is; its progress comes from metrics.jsonl
            if line.strip():
                logger.info("%s", line)
            reporter.poll()
        code = proc.returncode
    reporter.poll()
    reporter.publish()
    error = None
    if code != 0:
        where = f" on node {node} of {config.train.nodes}" if config.train.nodes > 1 else ""
        error = TrainFailedError.of_launch(code, log_path, proc.tail, proc.worker_error(), where)
    ckpt = finished_checkpoint(out, config.train) if error is None else None
    if error is None and ckpt is None:
        error = TrainFailedError.of_launch(code, log_path, proc.tail, f"no final checkpoint in {paths.checkpoints_dir}")
    if error is not None:
        reporter.progress.fail(error)  # the progress artifact says Failed, not its last step
        raise error
    assert ckpt is not None
    return summary(out, ckpt, launched=True, last=reporter.last, reason=plan.reason)


def new_job(config: PipelineConfig, model_dir: str, plan: TrainPlan, out: Path) -> TrainJob:
    """The job file of this training: a resumed one keeps the store state and warm start it began with."""
    if plan.action == "resume" and TrainPaths(out).job_json.is_file():
        old = read_job(TrainPaths(out).job_json)
        init_from, key, tokens = old.init_from, old.data_key, old.data_tokens
    else:
        key, tokens = plan.data_key, plan.data_tokens
        current = pointed(current_link(Path(config.run_dir))) if config.train.init == "previous" else None
        init_from = str(current) if current is not None else None
        if config.train.init == "previous":
            get_run_logger().info("train: init=previous: %s", f"warm start from {current}" if current else
                                  "no promoted draft yet (draft/current), starting fresh")  # fmt: skip
    return TrainJob(
        train=config.train, run_dir=config.run_dir, model_dir=model_dir, out_dir=str(out), device=config.train.device,
        init_from=init_from, data_key=key, data_tokens=tokens,
    )  # fmt: skip


def summary(
    out: Path, ckpt: Path, *, launched: bool, last: dict[str, Any], waiting: bool = False, reason: str = ""
) -> TrainSummary:
    state = read_state(ckpt)
    return TrainSummary(
        out_dir=str(out),
        checkpoint=str(ckpt),
        step=state["step"],
        total_steps=state["total_steps"],
        launched=launched,
        last_metrics=last,
        waiting=waiting,
        reason=reason,
    )
