"""The train flow against a real Prefect server: torchrun as a child process on CPU (gloo), a tiny synthetic
store in the exact store format (eagle3.draft.synthetic: a learnable target, so the loss falls).

Checked: the run completes with a final checkpoint, progress reaches 100%, the TTT table and the curves
artifacts exist, the log streams into the flow run; a re-run launches nothing; killing the flow process
(SIGKILL: nothing of ours runs) takes torchrun and its workers down with it, and the next run resumes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from eagle3.config import PipelineConfig
from eagle3.draft.synthetic import SyntheticSpec, write_run
from eagle3.store.fsio import read_json
from eagle3.train.launch import read_metrics
from tests.e2e.test_flows import latest_artifact

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SPEC = SyntheticSpec(lengths=tuple([24, 40, 33, 17, 48, 29, 36, 21] * 4))


def config(root: Path, **train: object) -> PipelineConfig:
    base: dict[str, object] = {"batch_tokens": 128, "max_steps": 12, "lr": 3e-3, "warmup_steps": 2, "ttt_steps": 3,
                               "draft_vocab_size": 96, "precision": "fp32", "log_every": 2, "checkpoint_every": 4,
                               "loader_threads": 1, "prefetch_batches": 2}  # fmt: skip
    return PipelineConfig.model_validate(
        {
            "run_dir": str(root / "store"),
            "model": str(root / "target"),
            "stages": ["train"],
            "server": {"device": "cpu"},
            "train": {**base, **train},
        }
    )


@pytest.fixture
def store(tmp_path: Path) -> Path:
    write_run(tmp_path / "store", tmp_path / "target", SPEC)
    return tmp_path


def processes_with(text: str) -> list[int]:
    """Pids whose command line contains `text` (the job file's unique path names a training's processes)."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if text in (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    pids.append(int(d.name))
            except OSError:
                continue
    return pids


def test_train_flow_trains_reports_and_a_rerun_launches_nothing(prefect_server: str, store: Path) -> None:
    from flows.train import train_flow

    cfg = config(store)
    state = train_flow(cfg, return_state=True)
    assert state.is_completed(), state.message
    out = store / "store" / "train"
    latest = read_json(out / "checkpoints" / "latest.json")
    assert latest["step"] == 12
    records = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in records] == [2, 4, 6, 8, 10, 12]
    assert records[-1]["loss"] < records[0]["loss"]
    assert "train: 12/12" in (out / "train.log").read_text()  # the worker's progress lines reach the log
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    progress = latest_artifact("store-train-progress")
    assert progress.type == "progress" and progress.data == 100.0
    rows = json.loads(latest_artifact("store-train-metrics").data)
    assert [row["ttt_step"] for row in rows] == [0, 1, 2]
    assert rows[0]["accuracy"] == pytest.approx(records[-1]["step_acc"][0], abs=1e-4)
    assert "data:image/png;base64," in latest_artifact("store-train-curves").data

    before = (out / "train.log").stat().st_size
    state = train_flow(cfg, return_state=True)
    assert state.is_completed()
    assert (out / "train.log").stat().st_size == before, "a finished training was launched again"


def test_killing_the_flow_process_stops_torchrun_and_its_workers_and_the_next_run_resumes(
    prefect_server: str, store: Path
) -> None:
    cfg = config(store, max_steps=400, checkpoint_every=2, log_every=1)
    path = store / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    script = "import sys; from eagle3.config import load_config; from flows.train import train_flow; " \
             "train_flow(load_config(sys.argv[1]))"  # fmt: skip
    flow_proc = subprocess.Popen([sys.executable, "-c", script, str(path)], cwd=REPO, env={**os.environ},
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    out = store / "store" / "train"
    job = str(out / "job.json")
    deadline = time.monotonic() + 240
    while not (out / "checkpoints" / "latest.json").exists():  # training is under way
        assert flow_proc.poll() is None, "the flow process ended before training started"
        assert time.monotonic() < deadline, "no checkpoint within 240 s"
        time.sleep(0.5)
    assert len(processes_with(job)) >= 2  # torchrun (through the launcher) and one worker
    flow_proc.send_signal(signal.SIGKILL)
    flow_proc.wait()
    deadline = time.monotonic() + 60
    while processes_with(job):
        assert time.monotonic() < deadline, f"training processes outlived the flow: {processes_with(job)}"
        time.sleep(0.5)
    stopped_at = read_json(out / "checkpoints" / "latest.json")["step"]
    assert 2 <= stopped_at < 400

    from flows.train import train_flow

    state = train_flow(config(store, max_steps=stopped_at + 4, checkpoint_every=2, log_every=1), return_state=True)
    assert state.is_completed(), state.message
    steps = [r["step"] for r in read_metrics(out / "metrics.jsonl")]
    assert steps[-1] == stopped_at + 4 and steps == sorted(set(steps))


def test_a_train_wider_than_the_gpu_limit_is_refused_before_launching(prefect_server: str, store: Path) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate

    from flows.train import train_flow

    with get_client(sync_client=True) as client:
        client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name="gpu", limit=1))
    try:
        state = train_flow(config(store, nproc=2), return_state=True)
    finally:
        with get_client(sync_client=True) as client:
            client.delete_global_concurrency_limit_by_name("gpu")
    assert state.is_failed()
    with pytest.raises(ValueError, match=r"train.nproc=2 but the global concurrency limit 'gpu' has 1 slots"):
        state.result()
    assert not (store / "store" / "train" / "train.log").exists()


def test_a_target_sglang_feeds_another_tap_is_refused_before_training_when_export_follows(
    prefect_server: str, store: Path
) -> None:
    from eagle3.checks.preflight import ServingRefusedError
    from flows.train import train_flow

    cfg_path = store / "target" / "config.json"
    gemma = {"model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"]}
    cfg_path.write_text(json.dumps(json.loads(cfg_path.read_text()) | gemma))
    cfg = config(store).model_copy(update={"stages": ["train", "export"]})
    state = train_flow(cfg, return_state=True)
    assert state.is_failed()
    with pytest.raises(ServingRefusedError, match=r"Gemma3ForCausalLM.*not the residual stream.*export \("):
        state.result()
    assert "Gemma3ForCausalLM" in (state.message or ""), state.message  # the cause, where the UI shows it
    assert not (store / "store" / "train" / "train.log").exists()  # refused before training


def test_two_methods_train_from_one_store_each_into_its_own_directory_with_its_own_artifacts(
    prefect_server: str, store: Path
) -> None:
    """train.methods [eagle3, eagle3.1]: two trainings one after another, EAGLE-3's where it always was and
    EAGLE-3.1's under draft/eagle3.1/, each task run and progress artifact named for its method; a re-run trains
    neither again."""
    from flows.train import train_flow

    cfg = config(store, methods=["eagle3", "eagle3.1"], max_steps=4, checkpoint_every=4)
    state = train_flow(cfg, return_state=True)
    assert state.is_completed(), state.message
    for out, method in ((store / "store" / "train", "eagle3"), (store / "store" / "draft" / "eagle3.1" / "train",
                                                                 "eagle3.1")):  # fmt: skip
        latest = read_json(out / "checkpoints" / "latest.json")
        assert latest["step"] == 4
        assert read_json(out / "checkpoints" / "step-00000004" / "state.json")["method"] == method
    assert latest_artifact("store-train-progress").data == 100.0
    assert latest_artifact("store-eagle3-1-train-progress").data == 100.0
    logs = [(store / "store" / p / "train.log").stat().st_size for p in ("train", "draft/eagle3.1/train")]
    assert train_flow(cfg, return_state=True).is_completed()
    assert [(store / "store" / p / "train.log").stat().st_size for p in ("train", "draft/eagle3.1/train")] == logs
