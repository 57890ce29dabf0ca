"""Training again when the store grew: whether to, and where the finished training goes.

    plan_training(run_dir, train_cfg) -> TrainPlan     train | resume | done | wait (train.method's training)
    archive_training(run_dir, method) -> Path          train/ and eval/ -> trains/<n>/ (one rename each)

Each draft method trains in its own directory (eagle3/store/paths.py MethodPaths: EAGLE-3 in `<run_dir>/train/`,
another under `<run_dir>/draft/<method>/`) and is planned and archived on its own. `train/job.json` records the
store a training started on (run.json's dataset_fingerprint and the extracted tokens). A finished training of an
older state of the store is archived, and a new one starts in `train/` when at least train.min_new_tokens were
extracted since; with fewer, the draft stages wait.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from eagle3.config import TrainConfig
from eagle3.draft.checkpoint import latest_checkpoint
from eagle3.store.fsio import fsync_dir
from eagle3.store.paths import FIRST_METHOD, RunPaths
from eagle3.store.run_store import RunStore
from eagle3.train.job import read_job
from eagle3.train.launch import finished_checkpoint

Action = Literal["train", "resume", "done", "wait"]


@dataclass(frozen=True)
class TrainPlan:
    action: Action  # train: start a training in train/ (archive the finished one first when `archive`)
    reason: str
    data_key: str
    data_tokens: int
    new_tokens: int
    archive: bool = False


def store_state(run_dir: Path) -> tuple[str, int]:
    """(run.json's dataset_fingerprint, tokens extracted in the store), from run.json and the shard manifests."""
    store = RunStore(run_dir)
    info = store.read_run_info()
    if info is None:
        raise FileNotFoundError(f"{store.run_json} missing; run the extract stage first")
    manifests = (store.read_manifest_fast(i) for i in range(store.num_shards()))
    return info.dataset_fingerprint, sum(m["tokens"] for m in manifests if m is not None)


def plan_training(run_dir: Path, cfg: TrainConfig) -> TrainPlan:
    key, tokens = store_state(run_dir)
    out = RunPaths(run_dir).method(cfg.method).train
    job = read_job(out.job_json) if out.job_json.is_file() else None
    if latest_checkpoint(out.checkpoints_dir) is None:
        return TrainPlan("train", "no training in this store yet", key, tokens, tokens)
    if finished_checkpoint(out.root, cfg) is None:
        return TrainPlan("resume", "the last training did not finish", key, tokens, 0)
    if job is None or job.data_key is None or job.data_key == key:
        return TrainPlan("done", "the store has not grown since the last finished training", key, tokens, 0)
    new = tokens - (job.data_tokens or 0)
    if new < cfg.min_new_tokens:
        return TrainPlan(
            "wait",
            f"{new} new tokens since the last training, fewer than train.min_new_tokens={cfg.min_new_tokens}",
            key, tokens, new,
        )  # fmt: skip
    return TrainPlan("train", f"{new} new tokens since the last training", key, tokens, new, archive=True)


def archive_training(run_dir: Path, method: str = FIRST_METHOD) -> Path:
    """Move the method's train/ and eval/ (the finished training and its evaluation) to its trains/<n>/; returns that
    directory. Its exports stay under its exports/ (each with its evaluation)."""
    paths = RunPaths(run_dir).method(method)
    root, trains = paths.root, paths.trains_dir
    trains.mkdir(exist_ok=True)
    n = 1 + max((int(p.name) for p in trains.iterdir() if p.name.isdigit()), default=0)
    dest = trains / f"{n:04d}"
    dest.mkdir()
    for name in paths.archived_names:  # eval first: a kill between leaves no old evaluation beside a new training
        if (root / name).exists():
            os.replace(root / name, dest / name)
    fsync_dir(dest)
    fsync_dir(root)
    return dest
