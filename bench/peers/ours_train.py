"""Our trainer on the store, in a process of its own (as the peers' run), so start-up and peak memory are measured
the same way on both sides: the library's Trainer as the torchrun worker runs it (eagle3/train/worker.py), one
process.

    .venv/bin/python bench/peers/ours_train.py RESULT.json JOB.json

RESULT.json: every logged step (seconds since this process started, loss, tokens), peak RSS, the checkpoint.
"""

from __future__ import annotations

import time

T0 = time.monotonic()  # before torch's import, as in speculators_train.py

import json  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main(result_path: Path, job_path: Path) -> None:
    import torch

    from eagle3.store.paths import TrainPaths
    from eagle3.train.job import read_job
    from eagle3.train.trainer import Trainer

    job = read_job(job_path)
    steps: list[dict[str, object]] = []
    t_wall0 = time.time() - (time.monotonic() - T0)
    with Trainer.build(job) as trainer:
        cpu: list[float] = []  # this process's CPU seconds (all threads) at the end of each step
        step = trainer.train_step

        def timed_step(batch: Any) -> Any:
            out = step(batch)
            cpu.append(time.process_time())
            return out

        trainer.train_step = timed_step  # type: ignore[method-assign]
        result = trainer.run()
    for line in TrainPaths(job.out_dir).metrics.read_text().splitlines():
        rec = json.loads(line)
        if "loss" in rec and "heldout" not in rec:
            steps.append({"t": rec["time"] - t_wall0, "step": rec["step"], "loss": rec["loss"],
                          "tokens": rec["tokens"], "lr": rec["lr"], "cpu": cpu[rec["step"] - 1]})  # fmt: skip
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result_path.write_text(json.dumps({
        "steps": steps, "peak_rss_mb": peak_kb / 1024, "wall_s": time.monotonic() - T0, "checkpoint": result.checkpoint,
        "shims": [], "torch": torch.__version__,
        "peak_gpu_mb": torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None,
    }, indent=1))  # fmt: skip


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
