"""RowSampler (eagle3/data/row_sampler.py, one batched inverse-CDF draw) vs the per-row torch.Generator loop it
replaced, per decode step, at synthesize's batch sizes (half the rows sampled, as with `include_greedy` and
samples_per_prompt 2). The same logits for both; medians of interleaved repeats.

    python bench/sampler_bench.py --device cpu --batches 64 256
    python bench/sampler_bench.py --device cuda --batches 256 1024      # on a GPU node
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from eagle3.data.row_sampler import RowSampler


def per_row_generators(scores: torch.Tensor, sampling: list[tuple[float, int]], top_p: float) -> torch.Tensor:
    """The replaced design: one torch.Generator per sampled row, one multinomial per row per step."""
    rows = [i for i, (t, _) in enumerate(sampling) if t > 0]
    gens = {i: torch.Generator(device=scores.device).manual_seed(sampling[i][1]) for i in rows}
    index = torch.tensor(rows, device=scores.device)
    temps = torch.tensor([sampling[i][0] for i in rows], device=scores.device).unsqueeze(1)
    probs = torch.softmax(scores[index].float() / temps, dim=-1)
    sorted_p, order = torch.sort(probs, descending=True, dim=-1)
    drop = torch.cumsum(sorted_p, dim=-1) - sorted_p > top_p
    probs = probs.scatter(1, order, sorted_p.masked_fill(drop, 0.0))
    out = scores.clone()
    for j, row in enumerate(rows):
        token = torch.multinomial(probs[j], 1, generator=gens[row])
        out[row] = torch.finfo(out.dtype).min
        out[row, token] = 0.0
    return out


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batches", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    device = torch.device(args.device)
    print(f"device {device}, vocab {args.vocab}, torch {torch.__version__}, threads {torch.get_num_threads()}")
    print("\n| batch | sampled rows | per-row generators (ms/step) | RowSampler (ms/step) | speed-up |")
    print("|---:|---:|---:|---:|---:|")
    for b in args.batches:
        scores = torch.randn(b, args.vocab, device=device) * 3
        sampling = [(0.8 if i % 2 else 0.0, 1000 + i) for i in range(b)]
        old, new = [], []
        sampler = RowSampler(sampling, 0.95, device)
        for _ in range(args.repeats):
            sync(device)
            t0 = time.perf_counter()
            per_row_generators(scores, sampling, 0.95)
            sync(device)
            t1 = time.perf_counter()
            sampler(scores, scores)
            sync(device)
            t2 = time.perf_counter()
            old.append(t1 - t0)
            new.append(t2 - t1)
        o, n = statistics.median(old) * 1e3, statistics.median(new) * 1e3
        print(f"| {b} | {b // 2} | {o:.1f} | {n:.1f} | {o / n:.1f}x |")


if __name__ == "__main__":
    main()
