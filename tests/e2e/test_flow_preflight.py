"""Every flow refuses, before its first stage, what its stages would refuse on the worker it runs on (this CPU box):
a device set to cuda, a vocabulary map built for another train.draft_vocab_size; a fan-out refuses what its nodes
would, before it starts one. The refusal names the key and the fix in the flow run's state message and failure
artifact, and nothing was started (no torchrun, no server, no node). Real flows against a real Prefect server, on a
tiny synthetic store (the fan-out: a prepared demo-model store)."""

from __future__ import annotations

import json
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


@pytest.fixture
def prepared(tmp_path: Path, demo_model: Path) -> Path:
    """A prepared demo-model store (4 chats) whose run.json says its samples are float32 (what extraction writes
    first), and no samples yet."""
    from eagle3.config import load_config
    from eagle3.data.prepare import prepare
    from eagle3.extract.engines.base import EngineInfo
    from eagle3.extract.shard import open_run
    from eagle3.serving.aux_layers import resolve_aux_layers
    from eagle3.store.run_store import RunStore
    from eagle3.target.files import read_model_facts

    chats = [{"messages": [{"role": "user", "content": f"Fact {i}?"}, {"role": "assistant", "content": "Yes."}]}
             for i in range(4)]  # fmt: skip
    (tmp_path / "chats.jsonl").write_text("".join(json.dumps(c) + "\n" for c in chats))
    cfg = load_config(None, [f"run_dir={tmp_path / 'store'}", f"model={demo_model}", "server.dtype=float32",
                             f"data.dataset={tmp_path / 'chats.jsonl'}", "data.shard_size=2"])  # fmt: skip
    store = RunStore(cfg.run_dir)
    prepare(cfg, store, demo_model)
    layers = resolve_aux_layers(None, read_model_facts(demo_model).num_layers)
    open_run(cfg, store, demo_model, EngineInfo("transformers", "test", layers, layers, "hf"))
    return Path(cfg.run_dir)


@pytest.mark.parametrize(
    ("setting", "says"),
    [
        ("server.dtype=bfloat16", "server.dtype: store has 'float32', now 'bfloat16'"),
        ("extract.aux_layers=[2,15,40]", "extract.aux_layers [2, 15, 40]: [40] out of range for a 30-layer model"),
    ],
    ids=["store-dtype", "aux-layers-past-the-model"],
)
def test_the_extract_fanout_flow_refuses_what_its_nodes_would_before_starting_one(
    prefect_server: str, prepared: Path, demo_model: Path, setting: str, says: str
) -> None:
    """Each node's open-run would refuse these (so every node started, and failed); the fan-out refuses them first."""
    from prefect import get_client

    from eagle3.config import load_config
    from flows.extract_fanout import extract_fanout_flow

    cfg = load_config(None, [f"run_dir={prepared}", f"model={demo_model}", "server.dtype=float32", setting])
    state = extract_fanout_flow(cfg, work_queues=["node-a", "node-b"], poll_s=1.0, return_state=True)
    message, markdown = failure_of(state, prepared)
    assert message.startswith("preflight failed: PreflightError: ") and says in message, message
    assert says in markdown
    with get_client(sync_client=True) as client:
        tasks = {t.name.rsplit("-", 1)[0] for t in client.read_task_runs()
                 if t.flow_run_id == state.state_details.flow_run_id}  # fmt: skip
    assert "preflight" in tasks and "launch-children" not in tasks  # no node was started
