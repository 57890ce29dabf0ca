"""Our trainer's CPU step, the paths before and after issue 48's two changes, on the peers bench's store: the same
batches from the same weights, variants interleaved round by round, process CPU seconds per step (all threads; on a
shared machine steadier than wall time) and the step's loss (equal across variants: the changes are exact).

    .venv/bin/python bench/train_cpu_bench.py [--root data/bench/peers] [--rounds 3] [--batches 3]

Variants (the two before-paths are written here, as they were):
    whole row      attention from one masked [heads, N, N] product per TTT step; the target head on every row
    blocked        eagle3.draft.layers.dense_attend (blocks of queries over their documents' keys); every row
    blocked+rows   and the target head on the labelled rows only (eagle3.draft.distill.labelled_rows): the trainer
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import eagle3.train.trainer as trainer_module
from bench.peers.demo_store import demo_store
from bench.peers.side import REPO
from eagle3.draft.layers import AttendFn, dense_attend
from eagle3.train.job import TrainJob
from eagle3.train.trainer import Trainer


def whole_row_attend(doc: Tensor) -> AttendFn:
    """The CPU attention before: one masked [heads, N, N] product over the whole row."""
    n = len(doc)
    pos = torch.arange(n)
    allowed = (doc[:, None] == doc[None, :]) & (pos[None, :] <= pos[:, None])

    def attend(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        g = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        s = torch.einsum("qhd,khd->hqk", q.float(), k.float()) / math.sqrt(q.shape[-1])
        s = s.masked_fill(~allowed, float("-inf"))
        out = torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), v.float())
        return out.to(q.dtype), torch.logsumexp(s, dim=-1).transpose(0, 1)

    return attend


def every_row(loss_mask: Tensor, remaining: Tensor) -> None:
    return None  # target_distribution(rows=None): the head on every row, as before


VARIANTS: dict[str, dict[str, Any]] = {
    "whole row": {"attend": whole_row_attend, "rows": every_row},
    "blocked": {"attend": dense_attend, "rows": every_row},
    "blocked+rows": {"attend": dense_attend, "rows": trainer_module.labelled_rows},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, default=REPO / "data" / "bench" / "peers")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batches", type=int, default=3)
    args = ap.parse_args()
    cfg = demo_store(args.root.resolve() / "store", ["train.device=cpu", "train.heldout_fraction=0.1"])
    labelled_rows = trainer_module.labelled_rows
    with tempfile.TemporaryDirectory() as out:
        job = TrainJob(train=cfg.train, run_dir=str(cfg.run_dir), model_dir=str(cfg.model), out_dir=out, device="cpu")
        with Trainer.build(job) as tr:
            it = tr.stream.iterate(tr.pos)
            batches = [next(it)[1] for _ in range(args.batches)]  # the loader's threads idle once it is 4 ahead
            start = ({k: v.clone() for k, v in tr.module.state_dict().items()}, tr.optimizer.state_dict())
            tr.train_step(batches[0])  # warm-up: first-call allocations and kernel set-up
            cpu: dict[str, list[float]] = {v: [] for v in VARIANTS}
            losses: dict[str, list[float]] = {v: [] for v in VARIANTS}
            for r in range(args.rounds):
                for name in list(VARIANTS)[r % 3 :] + list(VARIANTS)[: r % 3]:  # order rotated per round
                    tr.attend_for = VARIANTS[name]["attend"]  # type: ignore[method-assign]
                    trainer_module.labelled_rows = VARIANTS[name]["rows"]
                    for b in batches:
                        tr.module.load_state_dict(start[0])
                        tr.optimizer.load_state_dict(start[1])
                        c0 = time.process_time()
                        step = tr.train_step(b)
                        cpu[name].append(time.process_time() - c0)
                        if r == 0:
                            losses[name].append(step.loss)
            trainer_module.labelled_rows = labelled_rows
    tokens = statistics.mean(b.num_tokens for b in batches)
    print(f"{len(batches)} batches of {tokens:.0f} tokens (rows of {batches[0].input_ids.shape[0]}), "
          f"{args.rounds} rounds; torch {torch.__version__}, {torch.get_num_threads()} threads")  # fmt: skip
    base = statistics.median(cpu["whole row"])
    print("| variant | CPU s per step (median) | vs whole row | losses of the batches |")
    print("|---|---:|---:|---|")
    for name in VARIANTS:
        med = statistics.median(cpu[name])
        print(f"| {name} | {med:.2f} | {base / med:.2f}x | {', '.join(f'{x:.5f}' for x in losses[name])} |")


if __name__ == "__main__":
    main()
