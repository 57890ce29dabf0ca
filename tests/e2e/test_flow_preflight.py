"""Every flow refuses, before its first stage, what its stages would refuse on the worker it runs on (this CPU box):
a device set to cuda, a vocabulary map built for another train.draft_vocab_size. The refusal names the key and the
fix in the flow run's state message and failure artifact, and nothing was started (no torchrun, no server). Real
flows against a real Prefect server, on a tiny synthetic store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from eagle3.draft.synthetic import SyntheticSpec, write_run
from tests.e2e.test_failure_report_flows import failure_of
from tests.e2e.test_train_flow import config

pytestmark = pytest.mark.slow


@pytest.fixture
def store(tmp_path: Path) -> Path:
    write_run(tmp_path / "store", tmp_path / "target", SyntheticSpec(lengths=(24, 40, 33, 17)))
    return tmp_path


def refused(state: Any, run_dir: Path, says: str, todo: str) -> None:
    message, markdown = failure_of(state, run_dir)
    assert message.startswith("preflight failed: PreflightError: Refused before the first stage, on this worker:")
    assert says in message and todo in message.split("What to do:")[1], message
    assert says in markdown and todo in markdown.split("**What to do:**")[1]
    assert not (run_dir / "train" / "train.log").exists()  # nothing launched


@pytest.mark.parametrize(
    ("train", "says", "todo"),
    [
        (
            {"draft_vocab_size": 64},
            "vocab_map.safetensors has 96 draft ids, train.draft_vocab_size asks 64. Set train.draft_vocab_size: 96",
            "was built for another draft vocabulary",
        ),
        ({"device": "cuda"}, "train.device: cuda, but this worker has no CUDA device", "no usable CUDA device"),
    ],
    ids=["vocabulary-mismatch", "train-cuda"],
)
def test_the_train_flow_refuses_before_training(
    prefect_server: str, store: Path, train: dict[str, object], says: str, todo: str
) -> None:
    from flows.train import train_flow

    cfg = config(store, **train)
    refused(train_flow(cfg, return_state=True), Path(cfg.run_dir), says, todo)


def test_the_train_node_flow_refuses_a_device_its_node_lacks(prefect_server: str, store: Path) -> None:
    from flows.train import train_node_flow

    cfg = config(store, device="cuda", nodes=2, rdzv_endpoint="127.0.0.1:29999")
    state = train_node_flow(cfg, return_state=True)
    refused(state, Path(cfg.run_dir), "train.device: cuda, but this worker has no CUDA device", "`train.device`")


def test_the_extract_flow_refuses_a_server_device_this_worker_lacks(prefect_server: str, store: Path) -> None:
    from flows.extract import extract_flow

    cfg = config(store).model_copy(update={"stages": ["extract"]})
    cfg = cfg.model_copy(update={"server": cfg.server.model_copy(update={"device": "cuda"})})
    state = extract_flow(cfg, return_state=True)
    says = "server.device: cuda, but this worker has no CUDA device (server.engine transformers"
    refused(state, Path(cfg.run_dir), says, "set `train.device`, `server.device` and `evaluate.device` to `cpu`")
