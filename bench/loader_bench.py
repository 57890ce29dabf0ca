"""How much the trainer's data loader slows the training loop's own host work.

    python bench/loader_bench.py --root /tmp/lb [--hidden 4096] [--threads 8] [--seconds 5]

The training loop is host-bound for stretches (kernel launches, the per-step sync), so loader threads that
hold the GIL while reading delay the GPU even when the data is ready in time. This bench writes a store of
2048-token samples (K=3 aux layers, bf16), then, for each reader, runs `--threads` reader threads that pack
16384-token rows continuously (dropping the files from the page cache after each row, so reads come from the
device) while the main thread runs a probe of small torch ops, the kind a training step launches. It prints
the probe's rate relative to an idle run, and the readers' bandwidth.

Readers: `pread` is the trainer's (eagle3/draft/data.py read_row: os.preadv straight into the row's buffer,
GIL released); `safetensors` is the one it replaced (safe_open + get_slice, then a copy into the row),
kept here as the baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from pathlib import Path

import torch
from safetensors import safe_open

from eagle3.draft.data import read_row
from eagle3.store.sample_format import KEYS, encode_sample, write_sample

TOKENS, ROW = 2048, 16384


def make(root: Path, files: int, hidden: int) -> list[Path]:
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(files):
        p = root / f"s{i:03d}.safetensors"
        if not p.exists():
            g = torch.Generator().manual_seed(i)
            aux = torch.randn(TOKENS, 3, hidden, generator=g).to(torch.bfloat16)
            last = torch.randn(TOKENS, hidden, generator=g).to(torch.bfloat16)
            ids = torch.randint(0, 32000, (TOKENS,), generator=g)
            write_sample(p, encode_sample(p.stem, [2, 16, 29], ids, torch.ones(TOKENS, dtype=torch.uint8), aux, last))
        paths.append(p)
    return paths


def evict(paths: list[Path]) -> None:
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def read_safetensors(paths: list[Path]) -> int:
    """The replaced reader: slices through safetensors' own reader, then copied into the packed row."""
    parts = []
    for p in paths:
        with safe_open(str(p), framework="pt") as f:
            parts.append({k: f.get_slice(k)[:ROW] for k in KEYS})
    aux = torch.cat([s["aux_hidden_states"] for s in parts])
    last = torch.cat([s["last_hidden_state"] for s in parts])
    return aux.nbytes + last.nbytes


def read_pread(paths: list[Path]) -> int:
    row = read_row(paths, ROW)
    return row.aux_hidden.nbytes + row.last_hidden.nbytes


def probe(stop: threading.Event, seconds: float) -> float:
    """Small torch ops per second on the main thread (a stand-in for a training step's host work)."""
    x = torch.ones(64)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(100):
            x = x.add(1.0).mul_(0.5)
        n += 100
    stop.set()
    return n / (time.perf_counter() - t0)


def run(paths: list[Path], reader: str, threads: int, seconds: float) -> dict[str, float | str]:
    per_row = ROW // TOKENS
    fn = {"pread": read_pread, "safetensors": read_safetensors}[reader]
    stop = threading.Event()
    moved = [0]
    lock = threading.Lock()

    def work(tid: int) -> None:
        i = tid
        while not stop.is_set():
            rows = [paths[(i * per_row + j) % len(paths)] for j in range(per_row)]
            n = fn(rows)
            evict(rows)
            with lock:
                moved[0] += n
            i += threads

    evict(paths)
    workers = [threading.Thread(target=work, args=(t,), daemon=True) for t in range(threads)]
    for w in workers:
        w.start()
    t0 = time.perf_counter()
    rate = probe(stop, seconds)
    wall = time.perf_counter() - t0
    for w in workers:
        w.join()
    return {"reader": reader, "probe_ops_per_s": rate, "read_GB_per_s": moved[0] / wall / 1e9}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, default=Path("/tmp/eagle3-loader-bench"))
    ap.add_argument("--files", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(1)
    paths = make(args.root, args.files, args.hidden)
    mb = sum(p.stat().st_size for p in paths) / 2**20
    print(json.dumps({"files": len(paths), "MiB": round(mb), "hidden": args.hidden, "threads": args.threads}))
    results = []
    for _ in range(args.repeats):  # interleaved, so drift on a shared machine hits both readers alike
        idle = probe(threading.Event(), args.seconds)
        results.append({"reader": "none (idle)", "probe_ops_per_s": idle, "read_GB_per_s": 0.0})
        for reader in ("safetensors", "pread"):
            r = run(paths, reader, args.threads, args.seconds)
            r["probe_vs_idle"] = r["probe_ops_per_s"] / idle  # type: ignore[operator]
            results.append(r)
            print(json.dumps(r), flush=True)
    print("\n| reader | probe ops/s | probe vs idle | read GB/s |\n|---|---:|---:|---:|")
    for r in results:
        vs = f"{r['probe_vs_idle']:.2f}" if "probe_vs_idle" in r else "1.00"
        print(f"| {r['reader']} | {r['probe_ops_per_s']:,.0f} | {vs} | {r['read_GB_per_s']:.2f} |")


if __name__ == "__main__":
    main()
