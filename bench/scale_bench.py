"""Extraction throughput with 1 vs 2 servers on one machine, and the projected scaling table for N nodes.

    .venv/bin/python bench/scale_bench.py                          # SGLang on CPU (two servers launched here)
    .venv/bin/python bench/scale_bench.py --engine transformers    # two in-process engines (one shared model)
    python3 bench/scale_bench.py --engine transformers --device cuda --gpus 0 1 --model /tmp/llama1b \
        --samples 256 --seq-len 2048 --batch-tokens 16384          # a 2-GPU node: one engine per GPU
    .venv/bin/python bench/scale_bench.py --project-only --per-server-tok-s 84606 --bytes-per-token 16393 \\
        --storage-mb-s 5000 --servers-per-node 1                    # the table alone, from numbers measured elsewhere

Measured, on a fresh store per pass, passes alternating (1 server, 2 servers, 1, 2, ...) so load drift on a
shared machine hits both alike:
  one server    every shard on server #0, one after another
  two servers   the same shards on both servers at once: one thread per server, each taking the next shard under
                its lease (eagle3.store.lease) and a free server (eagle3.serving.specs, as eagle3/extract/pool.py lends
                them), the extract flow's own pattern without Prefect's bookkeeping
  lease cost    take + give back one shard lease on the store's filesystem
  write bw      fsynced atomic writes of sample-sized files, 4 threads (the store's filesystem)
Servers are started (and warmed up) before the first pass and stay up.

The projection: N nodes x s servers each, at the measured one-server rate r (each server on its own hardware,
as on GPU nodes: a CPU machine's two servers share its cores, so its 2-server speed-up is a floor, not the
multi-node one), capped by the shared storage's write bandwidth B: min(N*s*r, B / bytes_per_token). Lease
traffic is one create + one delete + a heartbeat every 30 s per shard in flight: negligible next to the samples.
"""

from __future__ import annotations

import argparse
import os
import queue
import random
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from disk_probe import write_bandwidth

from eagle3.config import PipelineConfig
from eagle3.extract.engines import Engine, EngineInfo
from eagle3.extract.engines.transformers_engine import LoadedModels
from eagle3.extract.pool import build_server_engine
from eagle3.extract.shard import extract_shard, open_run
from eagle3.serving.specs import ServerSpec, server_specs
from eagle3.store.lease import ShardLease
from eagle3.store.run_store import PREPARED_SCHEMA, PreparedManifest, PreparedSample, RunInfo, RunStore
from eagle3.target.demo import resolve_model
from eagle3.target.files import read_model_facts, tokenizer_fingerprint

MB = 1 << 20
SGLANG_PYTHON = Path(__file__).resolve().parents[1] / ".venv-sglang" / "bin" / "python"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine", default="sglang", choices=["sglang", "transformers"])
    p.add_argument("--model", default="demo", help="model directory, or `demo` (SmolLM2-135M)")
    p.add_argument("--data-dir", default="data")
    p.add_argument("--device", default="cpu", choices=["auto", "cpu", "cuda"])
    p.add_argument("--samples", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=256, help="longest sample; lengths are uniform in [L/2, L]")
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--repeats", type=int, default=2, help="pairs of passes (1 server, then 2)")
    p.add_argument("--port", type=int, default=31250, help="sglang: first server's port (the second: +1)")
    p.add_argument("--gpus", nargs=2, help="the two servers' GPUs, e.g. `0 1` (sglang: `0,1 2,3`)")
    p.add_argument("--batch-tokens", type=int, default=8192, help="transformers engine: tokens per forward batch")
    p.add_argument("--writer-threads", type=int, default=2, help="writer threads per shard (the flow uses 2)")
    p.add_argument("--work-dir", default="data/runs/bench")
    p.add_argument("--project-only", action="store_true", help="print the projection from the numbers below")
    p.add_argument("--per-server-tok-s", type=float, help="projection: one server's extraction rate")
    p.add_argument("--bytes-per-token", type=float, help="projection: store bytes per token")
    p.add_argument("--storage-mb-s", type=float, help="projection: shared storage write bandwidth (MiB/s)")
    p.add_argument("--servers-per-node", type=int, default=1)
    return p.parse_args()


def make_prepared(store: RunStore, model_dir: Path, n: int, shards: int, seq_len: int, vocab: int) -> None:
    """Random token ids, lengths uniform in [seq_len/2, seq_len], dealt into `shards` shards."""
    rng = random.Random(0)
    rows: list[dict[str, Any]] = []
    for i in range(n):
        t = rng.randint(max(1, seq_len // 2), seq_len)
        ids = [rng.randrange(vocab) for _ in range(t)]
        rows.append({"sample_id": f"b{i:05d}", "input_ids": ids, "loss_mask": [1] * t, "num_tokens": t,
                     "source": f"bench:{i}", "messages": "[]"})  # fmt: skip
    dealt = [rows[i::shards] for i in range(shards)]
    for i, part in enumerate(dealt):
        store.write_prepared_shard(i, pa.Table.from_pylist(part, schema=PREPARED_SCHEMA))
    tokens = [sum(int(r["num_tokens"]) for r in part) for part in dealt]
    tokenizer = tokenizer_fingerprint(model_dir)
    store.write_prepared_manifest(
        PreparedManifest(dataset="bench", dataset_fingerprint="bench", tokenizer_sha256=tokenizer, num_samples=n,
                         num_tokens=sum(tokens), num_loss_tokens=sum(tokens), shards=[len(p) for p in dealt],
                         shard_tokens=tokens, config={})
    )  # fmt: skip


def fresh(store: RunStore) -> None:
    for name in ("shards", "run.json", "leases"):
        path = store.root / name
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)


class Servers:
    """The engines of the two servers, built and started once; `take`/`give` lend one to a shard at a time."""

    def __init__(self, cfg: PipelineConfig, model_dir: Path):
        self.specs: list[ServerSpec] = server_specs(cfg, host="bench")
        models = LoadedModels()  # transformers: the two engines share one copy of the weights, as a flow's pool does
        self.engines: list[Engine] = [
            build_server_engine(s, model_dir, base_env=dict(os.environ), models=models) for s in self.specs
        ]
        self.free: queue.Queue[int] = queue.Queue()

    @property
    def info(self) -> EngineInfo:
        return self.engines[0].info

    def use(self, n: int) -> None:
        """Lend the first `n` servers from now on."""
        self.free = queue.Queue()
        for i in range(n):
            self.free.put(i)

    def close(self) -> None:
        for e in self.engines:
            e.close()


def one_shard(store: RunStore, shard: int, servers: Servers, info: RunInfo, writer_threads: int) -> int:
    lease = ShardLease(store.root, shard)
    assert lease.try_acquire(), f"shard {shard} is leased by someone else"
    index = servers.free.get()
    try:
        m = extract_shard(store, shard, servers.engines[index], info, writer_threads=writer_threads)
    finally:
        servers.free.put(index)
        lease.release()
    assert m.status == "complete", m.errors
    return m.tokens


def group_cpu_s(pgids: list[int]) -> float:
    """User + system CPU seconds of every live process in these process groups (launched servers)."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) in pgids:  # after "(comm)": state ppid pgrp ... utime(11) stime(12)
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def cpu_now(servers: Servers) -> float:
    """CPU seconds so far of this process and of the launched servers: a view of the work that other jobs' load
    on a shared machine does not inflate (wall time it does)."""
    pgids = [g for e in servers.engines if (g := getattr(getattr(e, "server", None), "pgid", None)) is not None]
    t = os.times()
    return t.user + t.system + group_cpu_s(pgids)


@dataclass
class Pass:
    seconds: float
    cpu_s: float
    tokens: int
    bytes: int


def extraction_pass(cfg: PipelineConfig, model_dir: Path, servers: Servers, n: int, writer_threads: int) -> Pass:
    """Extract every shard into a fresh store on the first `n` servers."""
    store = RunStore(cfg.run_dir)
    fresh(store)
    info = open_run(cfg, store, model_dir, servers.info)
    shards = range(store.num_shards())
    servers.use(n)
    start, cpu = time.perf_counter(), cpu_now(servers)
    with ThreadPoolExecutor(n) as threads:
        tokens = sum(threads.map(lambda s: one_shard(store, s, servers, info, writer_threads), shards))
    seconds, cpu_s = time.perf_counter() - start, cpu_now(servers) - cpu
    return Pass(seconds, cpu_s, tokens, sum(m.bytes for m in store.manifests()))


def lease_cost_ms(run_dir: Path, n: int = 200) -> float:
    start = time.perf_counter()
    for i in range(n):
        lease = ShardLease(run_dir, 100_000 + i)
        lease.try_acquire()
        lease.release()
    return 1000 * (time.perf_counter() - start) / n


def projection(per_server: float, bytes_per_token: float, storage_bps: float, servers_per_node: int) -> str:
    storage_tok_s = storage_bps / bytes_per_token
    lines = [
        f"per server {per_server:,.0f} tok/s, {servers_per_node} server(s) per node, {bytes_per_token:,.0f} B/token, "
        f"shared storage {storage_bps / MB:,.0f} MiB/s = {storage_tok_s:,.0f} tok/s",
        "",
        "| nodes | servers | compute tok/s | storage write needed | projected tok/s | bound by |",
        "|---:|---:|---:|---:|---:|---|",
    ]
    for nodes in (1, 2, 4, 8, 16, 32, 64):
        servers = nodes * servers_per_node
        compute = servers * per_server
        need = compute * bytes_per_token / MB
        projected = min(compute, storage_tok_s)
        bound = "compute" if compute <= storage_tok_s else "storage"
        lines.append(f"| {nodes} | {servers} | {compute:,.0f} | {need:,.0f} MiB/s | {projected:,.0f} | {bound} |")
    return "\n".join(lines)


def server_config(args: argparse.Namespace, run_dir: Path, model_dir: Path) -> PipelineConfig:
    slots: list[dict[str, Any]] = [{"gpus": g} for g in args.gpus] if args.gpus else [{}, {}]
    server: dict[str, Any] = {"engine": args.engine, "device": args.device, "servers": slots,
                              "batch_tokens": args.batch_tokens}  # fmt: skip
    if args.engine == "sglang":
        server.update(python=str(SGLANG_PYTHON), port=args.port, max_total_tokens=16384, startup_timeout_s=900)
    return PipelineConfig.model_validate({"run_dir": str(run_dir), "model": str(model_dir), "server": server})


def main() -> None:
    args = parse_args()
    if args.project_only:
        print(projection(args.per_server_tok_s, args.bytes_per_token, args.storage_mb_s * MB, args.servers_per_node))
        return
    model_dir = resolve_model(args.model, Path(args.data_dir))
    facts = read_model_facts(model_dir)
    Path(args.work_dir).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=args.work_dir, prefix="scale-bench-"))
    cfg = server_config(args, work / "run", model_dir)
    store = RunStore(cfg.run_dir)
    make_prepared(store, model_dir, args.samples, args.shards, args.seq_len, facts.vocab_size)
    servers = Servers(cfg, model_dir)
    try:
        warm = [PreparedSample(w.sample_id, w.input_ids, w.loss_mask, "") for w in store.prepared_samples(0)[:2]]
        for engine in servers.engines:  # start every server and load the weights before timing
            list(engine.extract(warm))
        runs: dict[int, list[Pass]] = {1: [], 2: []}
        for _ in range(args.repeats):
            for n in (1, 2):
                run = extraction_pass(cfg, model_dir, servers, n, args.writer_threads)
                runs[n].append(run)
                load = os.getloadavg()[0]
                print(f"pass: {n} server(s), {run.tokens / run.seconds:,.0f} tok/s, "
                      f"{run.tokens / run.cpu_s:,.0f} tok per CPU-s, load {load:.1f}", flush=True)  # fmt: skip
        bytes_per_token = runs[1][0].bytes / runs[1][0].tokens
        sample_size = int(runs[1][0].bytes / args.samples)
        bw = write_bandwidth(work / "bw", max(64 * MB, 200 * sample_size), sample_size, 4)
        lease_ms = lease_cost_ms(work / "run")
    finally:
        servers.close()
        shutil.rmtree(work, ignore_errors=True)
    rate = {k: sum(p.tokens for p in v) / sum(p.seconds for p in v) for k, v in runs.items()}
    cpu_rate = {k: sum(p.tokens for p in v) / sum(p.cpu_s for p in v) for k, v in runs.items()}
    cpus = os.cpu_count()
    print(f"\nengine {args.engine} on {args.device} ({cpus} CPUs), model {facts.model_type} {facts.num_layers} "
          f"layers, hidden {facts.hidden_size}; {args.samples} samples in {args.shards} shards, {runs[1][0].tokens} "
          f"tokens per pass, {args.repeats} passes each\n")  # fmt: skip
    print("| servers | tok/s | vs one server | tok per CPU-s (servers + client) | vs one server |")
    print("|---:|---:|---:|---:|---:|")
    for k in (1, 2):
        speedup, cpu_ratio = rate[k] / rate[1], cpu_rate[k] / cpu_rate[1]
        print(f"| {k} | {rate[k]:,.0f} | {speedup:.2f}x | {cpu_rate[k]:,.0f} | {cpu_ratio:.2f}x |")
    print(f"\nlease take + give back: {lease_ms:.2f} ms per shard; write bandwidth (sample-sized files, fsync, "
          f"4 threads): {bw / MB:,.0f} MiB/s; {bytes_per_token:,.0f} B/token\n")  # fmt: skip
    print(projection(rate[1], bytes_per_token, bw, 1))


if __name__ == "__main__":
    main()
