"""The training job: everything a training process needs, written to a file by the Prefect task and read by the
torchrun worker (eagle3/train/worker.py). Its own module so that the flow's process reads and writes jobs without
importing the trainer (torch.distributed, FSDP2, FlexAttention)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from eagle3.config import TrainConfig
from eagle3.store.fsio import atomic_write_json, read_json


class TrainJob(BaseModel):
    """Everything a training process needs; the Prefect task writes it to a file for the torchrun worker."""

    model_config = ConfigDict(extra="forbid")
    train: TrainConfig
    run_dir: str  # the store: run.json, index.arrow, vocab_map.safetensors, shards/
    model_dir: str  # the target model (config.json + safetensors): embedding, lm_head, RoPE
    out_dir: str  # metrics, TensorBoard, checkpoints
    device: Literal["auto", "cpu", "cuda"] = "auto"
    init_from: str | None = None  # an export directory to warm-start from (train.init=previous)
    data_key: str | None = None  # run.json's dataset_fingerprint when this training started (eagle3/release/retrain.py)
    data_tokens: int | None = None  # tokens extracted in the store when this training started


def write_job(path: Path, job: TrainJob) -> None:
    atomic_write_json(Path(path), job.model_dump(mode="json"))


def read_job(path: Path) -> TrainJob:
    return TrainJob.model_validate(read_json(Path(path)))
