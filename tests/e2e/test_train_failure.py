"""A training that fails in its torchrun worker says the worker's own exception (type and message, from torchrun's
error file) where a user looks first: the flow run's state message and its `<run>-failure` artifact, with the
log's path after it and the advice for that cause, never torchrun's ChildFailedError boilerplate. Real torchrun
launches on CPU (gloo) that fail for real causes, against a real Prefect server."""

from __future__ import annotations

from pathlib import Path

import pytest
from prefect import flow

from eagle3.config import PipelineConfig
from eagle3.draft.synthetic import SyntheticSpec, write_run
from tasks.failure import reports_failure
from tasks.train import train_task
from tests.e2e.test_failure_report_flows import failure_of
from tests.e2e.test_train_flow import config

pytestmark = pytest.mark.slow


@flow(name="train-only", flow_run_name="train-only {config.run_dir}")
@reports_failure
def train_only(config: PipelineConfig) -> str:
    """The train task alone, without the flows' preflight (which refuses these causes before training): what the
    worker itself raises is under test."""
    train_task(config, config.model)
    return config.run_dir


@pytest.fixture
def store(tmp_path: Path) -> Path:
    write_run(tmp_path / "store", tmp_path / "target", SyntheticSpec(lengths=(24, 40, 33, 17)))
    return tmp_path


@pytest.mark.parametrize(
    ("train", "says", "todo"),
    [
        (
            {"draft_vocab_size": 64},
            "TrainError: {run}/vocab_map.safetensors has 96 draft ids, train.draft_vocab_size asks 64; re-run convert",
            "set `train.draft_vocab_size`",
        ),
        ({"device": "cuda"}, "AssertionError: Torch not compiled with CUDA enabled", "no usable CUDA device"),
    ],
    ids=["vocabulary-mismatch", "cuda-on-a-cpu-worker"],
)
def test_the_workers_own_exception_and_its_advice_are_what_the_failed_run_says(
    prefect_server: str, store: Path, train: dict[str, object], says: str, todo: str
) -> None:
    cfg = config(store, **train)
    run_dir = Path(cfg.run_dir)
    message, markdown = failure_of(train_only(cfg, return_state=True), run_dir)
    log = (run_dir / "train" / "train.log").resolve()
    cause = says.format(run=cfg.run_dir)
    assert message.startswith(f"train failed: {cause} (torchrun exited with 1; whole log: {log})"), message
    assert todo in message.split("What to do:")[1], message
    assert "ChildFailedError" not in message and "error_file" not in message
    assert f"**First error:** {cause} (torchrun exited with 1; whole log: {log})" in markdown
    assert todo in markdown.split("**What to do:**")[1]
