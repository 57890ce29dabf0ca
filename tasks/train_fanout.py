"""train-fanout: one training over several nodes, one `train-node` flow run per node, started through each node's
work queue, watched as one job and summed up.

    launch_train_nodes_task   one child per node (tasks/children.py): train.nodes, train.node_rank, the launch token
                              (this flow run's id: node 0 publishes its rendezvous port under it), `gpu-<queue>`
    watch_train_nodes_task    until every node's run ends: one progress/ETA artifact from metrics.jsonl (steps; tok/s
                              is global rank 0's all-reduced sum over every process of every node); the first
                              node that fails gets the others cancelled, so no node waits on a lost peer
    train_fanout_outcome      Completed, or Failed naming the node that failed first and its error
    train_on_nodes            the three, as the train stage of a flow runs them when train.nodes > 1

torchrun itself ends the surviving nodes when a peer is lost (a closed socket fails the collective at once,
train.peer_timeout_s bounds the rest); the cancellation is the backstop, and it stops a node still waiting in the
rendezvous or for its `gpu` slots.
"""

from __future__ import annotations

import time
from uuid import UUID

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.runtime import flow_run
from prefect.states import Cancelled, Cancelling, Failed, State
from pydantic import BaseModel

from eagle3.config import PipelineConfig
from eagle3.store.paths import TrainPaths
from eagle3.train.launch import read_metrics
from tasks.artifacts import run_key, table_artifact
from tasks.children import FINAL, WATCH_TIMEOUT_S, ChildRun, launch_children
from tasks.progress import ProgressArtifact, describe
from tasks.train import GPU_LIMIT, node_gpu_limit, train_dir

CANCEL_GRACE_S = 180.0  # a cancelled node's worker stops it well within this; longer: the node is gone


class NodeRun(ChildRun):
    node_rank: int


class NodeResult(BaseModel):
    node_rank: int
    name: str
    work_queue: str | None
    state: str  # the state's name (Completed, Failed, Crashed, Cancelled, ...)
    state_type: str
    message: str
    ended: float | None  # the end state's time (epoch seconds): the first failure is the earliest


class TrainFanoutSummary(BaseModel):
    run_dir: str
    nodes: list[NodeResult]
    step: int
    total_steps: int


class NodeFailedError(RuntimeError):
    """A node's training flow run did not complete; the message names the node and its error."""


def node_config(config: PipelineConfig, nodes: int, node_rank: int) -> PipelineConfig:
    """Node `node_rank`'s config: the parent's, with its place among `nodes` nodes."""
    return config.model_copy(update={"train": config.train.model_copy(update={"nodes": nodes, "node_rank": node_rank})})


@task(name="launch-train-nodes", retries=1, retry_delay_seconds=10, timeout_seconds=600, cache_policy=NO_CACHE)
def launch_train_nodes_task(config: PipelineConfig, deployment: str, work_queues: list[str | None]) -> list[NodeRun]:
    """One flow run of `deployment` per entry of `work_queues` (None: the deployment's own queue; then no per-node
    `gpu` limit is known and each holds `gpu`), node i with train.node_rank i. Idempotent per parent flow run."""
    parent = flow_run.get_id() or f"local-{time.time_ns()}"
    runs = launch_children(
        deployment,
        work_queues,
        parameters=lambda i, queue: {
            "config": node_config(config, len(work_queues), i).model_dump(mode="json"),
            "rendezvous_token": parent,
            "gpu_limit": node_gpu_limit(queue) if queue else GPU_LIMIT,
        },
        run_name=lambda i, queue: f"train {config.run_dir} [node {i}: {queue or 'any'}]",
        key=f"{parent}-train-node",
        label="node",
    )
    return [
        NodeRun(id=str(r.id), name=r.name, work_queue=q, node_rank=i)
        for i, (r, q) in enumerate(zip(runs, work_queues, strict=True))
    ]


def read_nodes(runs: list[NodeRun]) -> list[NodeResult]:
    out = []
    with get_client(sync_client=True) as client:
        for r in runs:
            st = client.read_flow_run(UUID(r.id)).state
            final = st is not None and st.type.value in FINAL
            out.append(
                NodeResult(
                    node_rank=r.node_rank,
                    name=r.name,
                    work_queue=r.work_queue,
                    state=(st.name or st.type.value) if st is not None else "Pending",
                    state_type=st.type.value if st is not None else "PENDING",
                    message=(st.message or "") if st is not None else "",
                    ended=st.timestamp.timestamp() if final and st is not None else None,
                )
            )
    return out


def cancel_nodes(runs: list[NodeRun], nodes: list[NodeResult], why: str, *, final: bool = False) -> None:
    """Cancel every node's flow run still going: Cancelling (its worker stops the process; torchrun dies with it),
    or `final`, Cancelled outright (a node whose worker is gone never acts on Cancelling)."""
    with get_client(sync_client=True) as client:
        for r, n in zip(runs, nodes, strict=True):
            if n.state_type not in FINAL:
                state: State = Cancelled(message=why) if final else Cancelling(message=why)
                client.set_flow_run_state(UUID(r.id), state, force=True)


@task(name="watch-train-nodes", retries=0, timeout_seconds=WATCH_TIMEOUT_S, cache_policy=NO_CACHE)
def watch_train_nodes_task(config: PipelineConfig, runs: list[NodeRun], poll_s: float = 10.0) -> list[NodeResult]:
    """Wait for every node's flow run to end; meanwhile one progress artifact for the whole job
    (`<run>-train-fanout-progress`): steps, tok/s over all nodes, ETA, nodes running. The first node that ends
    without completing gets the others cancelled."""
    logger = get_run_logger()
    metrics = TrainPaths(train_dir(config)).metrics
    progress = ProgressArtifact(logger, key=run_key(config.run_dir, "train-fanout-progress"), min_interval_s=0.0)
    last_log, cancelled_at = 0.0, None
    while True:
        nodes = read_nodes(runs)
        records = read_metrics(metrics) if metrics.is_file() else []
        running = sum(1 for n in nodes if n.state_type not in FINAL)
        extra = f"{running}/{len(nodes)} nodes running"
        if records:
            last = records[-1]
            step, total, tps = int(last["step"]), int(last["total_steps"]), float(last["tokens_per_s"])
            eta = (total - step) * float(last["step_time_s"])
            text = describe(step, total, "steps", tps, eta if step < total else 0.0, extra)
            progress.update(100.0 * step / max(1, total), text, force=True)
        else:
            text = f"waiting for the first step; {extra}"
            progress.update(0.0, text, force=True)
        if time.monotonic() - last_log >= 60 or running == 0:
            logger.info("%s", text)
            last_log = time.monotonic()
        bad = [n for n in nodes if n.state_type in FINAL and n.state_type != "COMPLETED"]
        if bad and running and cancelled_at is None:
            first = min(bad, key=lambda n: n.ended or 0.0)
            why = f"node {first.node_rank} ({first.name}) ended {first.state}: the job cannot go on without it"
            logger.warning("%s; cancelling the other nodes", why)
            cancel_nodes(runs, nodes, why)
            cancelled_at = time.monotonic()
        elif running and cancelled_at is not None and time.monotonic() - cancelled_at > CANCEL_GRACE_S:
            why = f"not stopped by its worker within {CANCEL_GRACE_S:.0f}s of cancelling (its node is gone?)"
            logger.warning("%s; marking the rest Cancelled", why)
            cancel_nodes(runs, nodes, why, final=True)
        if running == 0:
            return nodes
        time.sleep(poll_s)


def train_fanout_summary(config: PipelineConfig, nodes: list[NodeResult]) -> TrainFanoutSummary:
    """The summary and a table artifact of the nodes (`<run>-train-fanout`)."""
    records = read_metrics(TrainPaths(train_dir(config)).metrics)
    last = records[-1] if records else {"step": 0, "total_steps": 0}
    rows = [
        {"node": n.node_rank, "flow run": n.name, "work queue": n.work_queue or "", "state": n.state,
         "message": n.message[:300]}
        for n in nodes
    ]  # fmt: skip
    table_artifact(run_key(config.run_dir, "train-fanout"), rows, f"Nodes that trained {config.run_dir}")
    return TrainFanoutSummary(
        run_dir=config.run_dir, nodes=nodes, step=int(last["step"]), total_steps=int(last["total_steps"])
    )


def train_fanout_outcome(s: TrainFanoutSummary) -> TrainFanoutSummary | State:
    """Completed when every node completed; Failed naming the node that failed first and its error."""
    bad = sorted((n for n in s.nodes if n.state_type != "COMPLETED"), key=lambda n: n.ended or float("inf"))
    if not bad:
        return s
    first = next((n for n in bad if n.state_type != "CANCELLED"), bad[0])  # the cause, not those cancelled for it
    message = (
        f"node {first.node_rank} ({first.name}, work queue {first.work_queue or 'any'}) {first.state}: "
        f"{first.message[:600]}. Stopped at step {s.step}/{s.total_steps}; run train-fanout again to resume from "
        f"the last checkpoint (on as many nodes, or fewer: docs/multinode.md)"
    )
    return Failed(message=message, data=NodeFailedError(message))


def train_on_nodes(config: PipelineConfig, deployment: str, poll_s: float = 10.0) -> TrainFanoutSummary | State:
    """The train stage over train.nodes nodes (call it from a flow): one `deployment` flow run per node, node i on
    train.work_queues[i] (or all on the deployment's queue), watched to the end; the summary, or Failed."""
    queues: list[str | None] = list(config.train.work_queues) or [None] * config.train.nodes
    runs = launch_train_nodes_task(config, deployment, queues)
    return train_fanout_outcome(train_fanout_summary(config, watch_train_nodes_task(config, runs, poll_s)))
