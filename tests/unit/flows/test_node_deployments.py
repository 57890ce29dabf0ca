"""The node deployments the fan-outs start are named next to their flows (flows/extract.py, flows/train.py), and
deploy/prefect.yaml deploys each under that name with that flow as its entrypoint; the `gpu` limit's name has one
home (tasks/train.py), which the node flow's default and deploy/deployments.py use."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest
import yaml

from flows.extract import EXTRACT_NODE_DEPLOYMENT, extract_flow
from flows.extract_fanout import extract_fanout_flow
from flows.train import TRAIN_NODE_DEPLOYMENT, train_node_flow
from flows.train_fanout import train_fanout_flow
from tasks.train import GPU_LIMIT

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    ("full_name", "flow", "entrypoint", "fanout"),
    [
        (EXTRACT_NODE_DEPLOYMENT, extract_flow, "flows/extract.py:extract_flow", extract_fanout_flow),
        (TRAIN_NODE_DEPLOYMENT, train_node_flow, "flows/train.py:train_node_flow", train_fanout_flow),
    ],
)
def test_each_node_deployment_is_deployed_under_its_name_with_its_flow(
    full_name: str, flow: Any, entrypoint: str, fanout: Any
) -> None:
    flow_name, _, deployment = full_name.partition("/")
    assert flow_name == flow.name
    spec = yaml.safe_load((REPO / "deploy" / "prefect.yaml").read_text())
    entrypoints = {d["name"]: d["entrypoint"] for d in spec["deployments"]}
    assert entrypoints.get(deployment) == entrypoint
    assert inspect.signature(fanout.fn).parameters["deployment"].default == full_name


def test_the_gpu_limit_is_named_once() -> None:
    assert inspect.signature(train_node_flow.fn).parameters["gpu_limit"].default == GPU_LIMIT
    for path in ("flows/train.py", "deploy/deployments.py"):
        assert '"gpu"' not in (REPO / path).read_text(), f"{path} spells the limit's name again: use GPU_LIMIT"
