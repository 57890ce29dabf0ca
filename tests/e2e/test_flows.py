"""The pipeline against a real local Prefect server, on six short conversations with the demo model.

One module-scoped run of prepare -> synthesize -> extract -> convert (through the `eagle3` CLI, as a
user would) feeds the checks: a verified store, artifacts in the API, a re-run that does no model work;
then a run with a broken sample ends Failed, naming its shard, while the other shards complete.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from eagle3.config import load_config
from eagle3.store.run_store import RunStore
from tests.integration.sglang_support import SGLANG_PYTHON

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
QUESTIONS = [
    "What is the capital of France?",
    "Name a colour of the sky.",
    "What is 3 times 4?",
    "Say hello in Spanish.",
    "Give one word that rhymes with cat.",
    "What do bees make?",
]


def write_config(tmp: Path, name: str, stages: tuple[str, ...] = ("prepare", "synthesize", "extract")) -> Path:
    data = tmp / "prompts.jsonl"
    with data.open("w") as f:
        for q in QUESTIONS:
            f.write(json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": "?"}]}))
            f.write("\n")
    cfg = {
        "run_dir": str(tmp / name),
        "model": "demo",
        "data_dir": str(REPO / "data"),
        "stages": list(stages),
        "data": {"dataset": str(data), "max_length": 128, "shard_size": 2},
        "synthesize": {"max_new_tokens": 8, "batch_size": 6},
        "server": {"engine": "transformers", "device": "cpu", "max_total_tokens": 4096},
        "extract": {"shard_retries": 1},
        "train": {"draft_vocab_size": 64, "max_steps": 3, "batch_tokens": 256, "ttt_steps": 2, "warmup_steps": 1,
                  "log_every": 1, "checkpoint_every": 3},
        "evaluate": {"num_prompts": 2, "max_new_tokens": 6, "draft_steps": 2, "fail_on_slowdown": False},
    }  # fmt: skip
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def latest_artifact(key: str) -> Any:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])), sort=ArtifactSort.CREATED_DESC, limit=1
        )
    assert found, f"no artifact with key {key!r}"
    return found[0]


def task_runs_of(flow_run_name_prefix: str, flow_run_id: Any) -> list[Any]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    return [r for r in runs if r.name.startswith(flow_run_name_prefix)]


@pytest.fixture(scope="module")
def demo_run(prefect_server: str, demo_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The pipeline run once through the CLI; returns (config path, CLI stdout)."""
    tmp = tmp_path_factory.mktemp("e2e")
    path = write_config(tmp, "run", ("prepare", "synthesize", "extract", "convert", "train", "export", "evaluate"))
    env = {**os.environ, "PREFECT_API_URL": prefect_server}
    proc = subprocess.run(
        [sys.executable, "-m", "flows.cli", "run", str(path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"eagle3 run failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return path, proc.stdout


def test_cli_run_builds_a_complete_verified_store(demo_run: tuple[Path, str]) -> None:
    path, out = demo_run
    cfg = load_config(path)
    store = RunStore(cfg.run_dir)
    assert f"store:  {store.root.resolve()}" in out and "/runs/flow-run/" in out
    info = store.read_run_info()
    assert info is not None and info.engine == "transformers" and info.aux_layers == [2, 15, 27]
    manifests = list(store.manifests())
    assert [m.shard for m in manifests] == [0, 1, 2]
    for m in manifests:
        assert m.status == "complete" and len(m.samples) == m.expected == 2 and not m.errors
        for sample in store.prepared_samples(m.shard):
            store.verify(m.shard, sample, info, m.samples[sample.sample_id].crc32)
    convert = json.loads((store.root / "convert.json").read_text())
    assert convert["num_samples"] == 6 and Path(convert["vocab_map_path"]).is_file()


def test_the_pipeline_trains_exports_and_evaluates_the_draft(demo_run: tuple[Path, str]) -> None:
    root = Path(load_config(demo_run[0]).run_dir)
    assert json.loads((root / "train" / "checkpoints" / "latest.json").read_text())["step"] == 3
    export = json.loads((root / "draft" / "latest" / "export.json").read_text())
    assert export["checkpoint_step"] == 3 and (root / "draft" / "latest" / "config.json").is_file()
    promotion = json.loads((root / "draft" / "promotion.json").read_text())  # the first draft: promoted
    assert promotion["promoted"] and (root / "draft" / "current").resolve() == Path(export["out_dir"]).resolve()
    from tests.e2e.test_reliability import events

    (event,) = events("eagle3.draft.promoted", f"eagle3.run.{root.name}")
    assert event.payload["reason"] == promotion["reason"] and "no current draft" in promotion["reason"]
    assert "draft/current" in latest_artifact("run-promotion").data
    offline = json.loads((root / "eval" / "offline.json").read_text())
    assert offline["num_prompts"] == 2 and 1.0 <= offline["acceptance_length"] <= 3.0
    assert offline["identical_to_greedy"] == 2  # speculative decoding reproduced plain greedy decoding
    live = json.loads((root / "eval" / "live.json").read_text())  # the export served by SGLang on CPU (cpu_spec)
    if SGLANG_PYTHON.exists():  # `make test` builds it
        assert live["status"] == "ok", live["summary"]
        assert live["eagle3"]["completion_tokens"] > 0 and 1.0 <= live["accept_length"] <= 3.0
        assert not live["flag"] and "speed not judged on CPU" in live["summary"]  # the CPU fallback's speed
        assert live["unexplained"] == 0, live["differences"]  # outputs differ only at near-ties (run Completed)
        assert (root / "eval" / "server-eagle3" / "sglang.log").is_file()
    else:  # evaluate.live auto skips, saying how to build the environment
        assert live["status"] == "skipped" and "make sglang-env" in live["reason"]
    evaluation = latest_artifact("run-evaluation").data
    assert f"{offline['acceptance_length']:.3f}" in evaluation
    summary = latest_artifact("run-run-summary").data
    assert "acceptance (offline)" in summary and "/draft" in summary and "speed (live SGLang)" in summary
    for key in ("run-train-metrics", "run-train-curves", "run-export"):
        latest_artifact(key)


def test_artifacts_show_full_progress_the_shard_table_and_a_summary(demo_run: tuple[Path, str]) -> None:
    progress = latest_artifact("run-extract-progress")
    assert progress.type == "progress" and float(progress.data) == 100.0
    assert "6/6 samples" in (progress.description or "")
    table = latest_artifact("run-extract-shards")
    rows = json.loads(table.data) if isinstance(table.data, str) else table.data
    assert [(r["shard"], r["status"], r["samples"]) for r in rows] == [
        (0, "complete", 2),
        (1, "complete", 2),
        (2, "complete", 2),
    ]
    assert latest_artifact("run-extract-failed-shards").description == "No failed shards."
    summary = latest_artifact("run-extract-summary")
    assert "6 / 6" in summary.data and "transformers" in summary.data and "[2, 15, 27]" in summary.data
    for stage in ("prepare", "synthesize", "convert", "train", "evaluate"):
        assert float(latest_artifact(f"run-{stage}-progress").data) == 100.0


def test_rerun_skips_every_shard_and_loads_no_model(
    demo_run: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoModelForCausalLM

    from flows.pipeline import pipeline

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a re-run of a finished pipeline loaded the model")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", refuse)
    state = pipeline(load_config(demo_run[0]), return_state=True)
    assert state.is_completed(), state.message
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    assert state.state_details.flow_run_id is not None
    parent = FlowRunFilterParentFlowRunId(any_=[state.state_details.flow_run_id])
    with get_client(sync_client=True) as client:
        (extract_run,) = client.read_flow_runs(flow_run_filter=FlowRunFilter(parent_flow_run_id=parent))
    shard_runs = task_runs_of("extract-shard-", extract_run.id)
    assert sorted(r.name for r in shard_runs) == [f"extract-shard-{i:05d}" for i in range(3)]
    assert {r.state.name for r in shard_runs} == {"Skipped"}


def test_a_broken_sample_fails_the_flow_naming_its_shard_while_others_complete(
    prefect_server: str, demo_model: Path, tmp_path: Path
) -> None:
    import pyarrow as pa

    from flows.pipeline import pipeline

    cfg = load_config(write_config(tmp_path, "broken"), ["stages=[prepare]"])
    assert pipeline(cfg, return_state=True).is_completed()
    store = RunStore(cfg.run_dir)
    table = store.read_prepared_shard(1).to_pydict()
    table["input_ids"][0] = [1, 2, 10**6]  # a token id past the vocabulary: the engine rejects this sample
    table["loss_mask"][0] = [0, 1, 1]
    store.write_prepared_shard(1, pa.Table.from_pydict(table, schema=store.read_prepared_shard(1).schema))

    state = pipeline(load_config(tmp_path / "broken.yaml", ["stages=[extract]"]), return_state=True)
    assert state.is_failed()
    assert "shard 1" in (state.message or "") and "shard 0" not in (state.message or "")
    status = {m.shard: m.status for m in store.manifests()}
    assert status == {0: "complete", 1: "partial", 2: "complete"}
    rows = latest_artifact("broken-extract-shards").data
    rows = json.loads(rows) if isinstance(rows, str) else rows
    assert [(r["shard"], r["status"]) for r in rows] == [(0, "complete"), (1, "partial"), (2, "complete")]
    assert "out of range" in rows[1]["error"]
    failed = latest_artifact("broken-extract-failed-shards")
    failed_rows = json.loads(failed.data) if isinstance(failed.data, str) else failed.data
    assert [r["shard"] for r in failed_rows] == [1] and "--stages extract" in (failed.description or "")
