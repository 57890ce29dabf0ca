"""The train fan-out's verdict over its nodes' end states (tasks/train_fanout.py), without a server."""

from __future__ import annotations

from tasks.train_fanout import NodeResult, TrainFanoutSummary, train_fanout_outcome


def node(rank: int, state: str, ended: float | None, message: str = "") -> NodeResult:
    return NodeResult(node_rank=rank, name=f"train r [node {rank}]", work_queue=f"node-{rank}", state=state.title(),
                      state_type=state, message=message, ended=ended)  # fmt: skip


def test_the_fanout_fails_naming_the_node_that_failed_first_not_those_cancelled_for_it() -> None:
    nodes = [
        node(0, "CANCELLED", 5.0, "node 2 ended Failed: the job cannot go on without it"),
        node(1, "FAILED", 4.0, "torchrun exited with 1 on node 1 of 3: peer lost"),
        node(2, "FAILED", 3.0, "torchrun exited with -9 on node 2 of 3; whole log: train-node2.log"),
    ]
    state = train_fanout_outcome(TrainFanoutSummary(run_dir="r", nodes=nodes, step=6, total_steps=40))
    assert not isinstance(state, TrainFanoutSummary) and state.is_failed()
    assert state.message is not None
    assert state.message.startswith("node 2 (train r [node 2], work queue node-2) Failed: torchrun exited with -9")
    assert "step 6/40" in state.message and "resume from the last checkpoint" in state.message


def test_every_node_completed_is_the_summary() -> None:
    s = TrainFanoutSummary(run_dir="r", nodes=[node(0, "COMPLETED", 1.0), node(1, "COMPLETED", 2.0)], step=4,
                           total_steps=4)  # fmt: skip
    assert train_fanout_outcome(s) is s
