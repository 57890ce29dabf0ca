"""The pipeline flow (prepare -> synthesize -> extract) on `server.engine: sglang`, real SGLang on CPU and a real
local Prefect server: the flow process SIGKILLed in the middle of synthesize, then run again, regenerates every
sample exactly once and loses none; each run launches its SGLang server once for both synthesize and extract."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

import eagle3.data.synthesize as synth
from eagle3.config import load_config
from eagle3.store.run_store import RunStore
from tests.e2e.test_faults_sglang_flow import LAUNCH, server_leaders
from tests.integration.sglang_support import SGLANG_PYTHON, require_sglang_env
from tests.ports import free_port

pytestmark = [pytest.mark.sglang, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
DATASET = REPO / "data" / "demo_prompts.jsonl"
SAMPLES = 12


def test_a_pipeline_killed_mid_synthesize_reruns_only_the_missing_samples_through_one_server_per_run(
    prefect_server: str, tmp_path: Path, demo_model: Path
) -> None:
    from flows.pipeline import pipeline

    require_sglang_env()
    port = free_port()
    path = tmp_path / "config.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "run_dir": str(tmp_path / "run"),
                "model": str(demo_model),
                "stages": ["prepare", "synthesize", "extract"],
                "data": {"dataset": str(DATASET), "max_samples": SAMPLES, "shard_size": 6, "max_length": 512},
                "synthesize": {"max_new_tokens": 24, "concurrency": 4},
                "server": {
                    "engine": "sglang",
                    "device": "cpu",
                    "python": str(SGLANG_PYTHON),
                    "port": port,
                    "max_total_tokens": 8192,
                },
                "extract": {"window": 2},
            }
        )
    )
    cfg = load_config(path)
    store = RunStore(cfg.run_dir)
    samples_dir = synth.synthesized_dir(store) / "samples"
    first = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "run", str(path)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        deadline = time.monotonic() + 900
        while len(list(samples_dir.glob("*.json"))) < 3:
            assert first.poll() is None, f"the first run ended early:\n{first.stdout.read()}"  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "no 3 synthesized samples within 900 s"
            time.sleep(0.05)
        first.kill()  # SIGKILL, mid-synthesize: requests in flight are lost
        first.wait(30)
    finally:
        if first.poll() is None:
            first.kill()
    deadline = time.monotonic() + 10  # the killed run's server dies with it (its keeper, eagle3/serving/keeper.py)
    while server_leaders(port) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert server_leaders(port) == [], "the SIGKILLed run's SGLang server outlived it"
    before = {p.stem: json.loads(p.read_text()) for p in samples_dir.glob("*.json")}
    assert 3 <= len(before) < SAMPLES and {r["generated_by"] for r in before.values()} == {first.pid}

    state = pipeline(cfg, return_state=True)
    assert state.is_completed(), state.message
    records: list[dict[str, Any]] = [
        json.loads(line) for p in sorted(synth.synthesized_dir(store).glob("shard-*.jsonl")) for line in p.open()
    ]
    assert sorted(r["source"] for r in records) == sorted(f"{DATASET}:{i}" for i in range(SAMPLES))  # none lost
    for r in records:  # generated once: the samples stored before the kill were not generated again
        again = before.get(r["source_sample_id"])
        assert r["generated_by"] == (first.pid if again else os.getpid())
        assert again is None or again == r
    assert store.read_prepared_manifest().num_samples == SAMPLES  # type: ignore[union-attr]
    assert sum(len(m.samples) for m in store.manifests()) == SAMPLES  # extracted: every sample, same server

    log = (Path(cfg.run_dir) / "server" / "sglang.log").read_text(errors="replace")
    assert log.count(LAUNCH) == 2  # one launch per run: synthesize and extract share it
    deadline = time.monotonic() + 30
    while server_leaders(port) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert server_leaders(port) == []  # the run stopped its server
