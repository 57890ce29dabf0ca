"""Our trainer on the store, one process of its own (bench/peers/ours_train.py), as the peers run theirs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from bench.peers.side import REPO, Side
from eagle3.config import PipelineConfig
from eagle3.draft.checkpoint import resolve_checkpoint
from eagle3.train.job import TrainJob, write_job


def train_ours(cfg: PipelineConfig, work: Path) -> Side:
    side = Side("eagle3-pipeline (ours)")
    out = work / "train"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    job = TrainJob(train=cfg.train, run_dir=str(cfg.run_dir), model_dir=str(cfg.model), out_dir=str(out),
                   device=cfg.train.device)  # fmt: skip
    write_job(work / "job.json", job)
    result = work / "result.json"
    argv = [sys.executable, str(REPO / "bench" / "peers" / "ours_train.py"), str(result), str(work / "job.json")]
    side.command = " ".join(argv[1:])
    with open(work / "train.log", "w") as log:
        proc = subprocess.run(argv, cwd=REPO, env=dict(os.environ), stdout=log, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        return side.failed(f"our trainer exited {proc.returncode}: {side.last_error(work / 'train.log')}")
    side.read_run(json.loads(result.read_text()))
    side.checkpoint = resolve_checkpoint(out)
    return side
