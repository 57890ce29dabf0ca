"""torchrun entry of the trainer: `torchrun --nproc_per_node N [--nnodes M ...] -m eagle3.train.worker <job.json>`.

Parses the job file (a validated TrainJob), reads torchrun's RANK / WORLD_SIZE / LOCAL_RANK (the only
environment it reads; MASTER_ADDR/PORT are read by torch's env:// rendezvous). RANK and WORLD_SIZE are global
over every node: the loader shards by them and global rank 0 alone writes checkpoints. Joins the process group
(nccl on CUDA, gloo on CPU; timeout train.peer_timeout_s), trains, and leaves the group even on failure. Rank 0
prints progress lines and, last, one JSON line with the result.
"""

from __future__ import annotations

import gc
import json
import os
import sys
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from eagle3.device import torch_device
from eagle3.lifetime import die_with_parent
from eagle3.progress import Progress
from eagle3.train.job import read_job
from eagle3.train.trainer import Trainer


def _print_progress(p: Progress) -> None:
    print(p.describe(), flush=True)


@record  # an exception is written to torchrun's error file, which the train task reads back (TrainFailedError)
def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: torchrun --nproc_per_node N -m eagle3.train.worker <job.json>", file=sys.stderr)
        return 2
    die_with_parent()  # torchrun gives each worker its own session: leave when torchrun does
    job = read_job(Path(args[0]))
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch_device(job.device, index=local_rank)
    if world > 1:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        backend = "nccl" if device.type == "cuda" else "gloo"
        # a peer lost without closing its sockets (a node gone) fails the collective after peer_timeout_s
        timeout = timedelta(seconds=job.train.peer_timeout_s)
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=timeout)
    try:
        with Trainer.build(job, rank=rank, world=world, local_rank=local_rank) as trainer:
            if rank == 0 and trainer.model.cfg.note:
                print(f"draft: {trainer.model.cfg.note}", flush=True)
            if rank == 0 and trainer.warm is not None:
                w = trainer.warm
                print(f"warm start from {w.export_dir}: {w.copied} tensors, lm_head rows of {w.lm_head_rows} of "
                      f"{w.draft_vocab} draft ids", flush=True)  # fmt: skip
            result = trainer.run(progress=_print_progress if rank == 0 else lambda _: None)
        del trainer
        gc.collect()  # the draft (FSDP2 state, DTensors, hooks in cycles) is gone before its process group
        if world > 1:
            # Leave together: rank 0 may still be writing the last checkpoint. A rank tearing down alone right
            # after an FSDP2 run on gloo was seen to abort at exit ("terminate called without an active
            # exception", about 1 run in 30, training complete).
            dist.barrier()
        if rank == 0:
            print(json.dumps({"result": asdict(result)}), flush=True)
        return 0
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
