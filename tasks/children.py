"""Child flow runs of a fan-out: started through a deployment, one per node's work queue, without waiting
(tasks/extract/fanout.py: extract children; tasks/train_fanout.py: training nodes).

    launch_children(deployment, work_queues, ...)   run_deployment(timeout=0) per queue, idempotent per parent
    child_states(children)                          child id -> its state type now (FINAL once it ended)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from uuid import UUID

from prefect import get_run_logger
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import FlowRun
from prefect.deployments import run_deployment
from pydantic import BaseModel

WATCH_TIMEOUT_S = 7 * 24 * 3600  # the children's own timeouts bound them; this only bounds a lost parent
FINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


class ChildRun(BaseModel):
    id: str
    name: str
    work_queue: str | None


def launch_children(
    deployment: str,
    work_queues: list[str | None],
    *,
    parameters: Callable[[int, str | None], dict[str, Any]],
    run_name: Callable[[int, str | None], str],
    key: str,
    label: str = "child",
) -> list[FlowRun]:
    """One flow run of `deployment` per entry of `work_queues` (None: the deployment's own queue), child i with
    `parameters(i, queue)` and the name `run_name(i, queue)`, started without waiting. Child i's idempotency key
    `<key>-<i>` (`key`: one per parent flow run) keeps a retry of the launching task from starting it twice. Each
    start is a line in the task's log (`<label> <i>: started ...`)."""
    logger = get_run_logger()
    runs = []
    for i, queue in enumerate(work_queues):
        run = run_deployment(  # sync here: returns the new FlowRun
            deployment,
            parameters=parameters(i, queue),
            timeout=0,
            work_queue_name=queue,
            idempotency_key=f"{key}-{i}",
            flow_run_name=run_name(i, queue),
        )
        assert isinstance(run, FlowRun)
        runs.append(run)
        logger.info("%s %d: started %s (%s) on work queue %s", label, i, run.name, run.id, queue or "(deployment's)")
    return runs


def child_states(children: list[ChildRun]) -> dict[str, str]:
    """Child id -> the type of its flow run's state now (PENDING before it has one)."""
    with get_client(sync_client=True) as client:
        out = {}
        for c in children:
            run = client.read_flow_run(UUID(c.id))
            out[c.id] = run.state.type.value if run.state is not None else "PENDING"
        return out
