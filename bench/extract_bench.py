"""Extraction throughput vs its two ceilings, measured in one run; prints a markdown table.

    forward   tokens/s of the plain base-model forward over the same batches (no capture, no copy, no write)
    extract   tokens/s of extract_shard into a fresh store (capture + copy to CPU + encode + atomic write)
    write bw  bytes/s of fsynced atomic writes to the store's filesystem (large files, and sample-sized ones)

binding limit, shard by shard = min(forward tok/s, write_bw / bytes_per_token), write_bw probed right before and
right after that shard's extraction; we report extract / binding (target >= 0.9)
and bytes per token on disk / (K+1) x H x 2, the bf16 minimum (target <= 1.02 for bf16, <= 0.51 for FP8:
--store-dtype float8_e4m3).

Host-time profile (where the extraction's extra CPU time goes), summed over all threads:
    submit-blocked  the forward thread waiting for a writer (queue full: the writers are the bottleneck)
    shard-drain     the forward thread waiting at a shard's end for the writers' backlog (the device idle)
    shard-open      the header checks of a shard's existing files before its first forward
    d2h-wait        the forward thread waiting for a batch's device-to-host copy
    encode / crc32 / write+fsync   per writer stage

The samples are split into shards and the two measurements alternate shard by shard (forward of
shard i, then extract_shard of shard i), so on a machine shared with other jobs both see the same
load; rates are total tokens / total time over all shards and repeats.

    .venv/bin/python bench/extract_bench.py --device cpu
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch
from disk_probe import write_bandwidth  # bench/, beside this script

from eagle3.config import PipelineConfig
from eagle3.extract.engines.transformers_engine import INFLIGHT, TransformersEngine, length_batches, rows_not_packed
from eagle3.extract.shard import WRITER_THREADS, extract_shard, open_run
from eagle3.store.run_store import DTYPES, PREPARED_SCHEMA, PreparedManifest, PreparedSample, RunStore
from eagle3.target.demo import resolve_model
from eagle3.target.files import ModelFacts, read_model_facts, tokenizer_fingerprint
from eagle3.versions import library_versions

MB = 1 << 20
PROBE_FILE = 64 * MB  # the write probes' file size


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="demo", help="model directory, or `demo` (SmolLM2-135M)")
    p.add_argument("--data-dir", default="data", help="where the demo model is installed")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    p.add_argument("--samples", type=int, default=24)
    p.add_argument("--seq-len", type=int, default=256, help="longest sample; lengths are uniform in [L/2, L]")
    p.add_argument("--shards", type=int, default=6, help="forward and extraction alternate shard by shard")
    p.add_argument("--batch-tokens", type=int, default=4096)
    p.add_argument("--writer-threads", type=int, default=WRITER_THREADS, help="default: extract.writer_threads'")
    p.add_argument("--repeats", type=int, default=2, help="passes over all shards (fresh store each time)")
    p.add_argument("--work-dir", default="data/runs/bench", help="temporary stores go here (the filesystem under test)")
    p.add_argument("--write-mb", type=int, default=256, help="bytes written by the large-file bandwidth probe")
    p.add_argument("--store-dtype", default="bfloat16", choices=["bfloat16", "float8_e4m3"])
    p.add_argument("--inflight", type=int, default=INFLIGHT, help="batches queued on the device during a hand-off")
    p.add_argument("--switch-interval", type=float, default=0.0, help="sys.setswitchinterval (0: Python's default)")
    return p.parse_args()


class Profile:
    """Seconds spent in a few host-side stages of extraction, summed over threads (bench-only wrappers)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._lock = threading.Lock()

    def wrap(self, owner: Any, name: str, stage: str) -> None:
        fn = getattr(owner, name)

        def timed(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                with self._lock:
                    self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - t0

        setattr(owner, name, timed)

    def install(self) -> None:
        import eagle3.extract.shard as ex
        import eagle3.store.sample_format as sf
        from eagle3.extract.engines import transformers_engine as te

        self.wrap(ex.SampleWriter, "submit", "submit-blocked")
        self.wrap(ex.SampleWriter, "close", "shard-drain")  # the shard's last writes, nothing left on the device
        self.wrap(ex, "adopt_existing", "shard-open")
        self.wrap(ex, "encode_sample_parts", "encode")
        self.wrap(sf, "atomic_write_parts", "write+fsync")
        self.wrap(sf.zlib, "crc32", "crc32")
        self.wrap(te.InFlight, "of", "d2h-launch")
        self.wrap(te.TransformersEngine, "launch", "forward-launch")
        self.wrap(te.TransformersEngine, "_copy_to_host", "pinned-alloc+copy-launch")
        self.wrap(te, "quantize_fp8", "quantize-launch")
        self.wrap(ex, "record_results", "record-results")
        self.wrap(torch.cuda.Event, "synchronize", "d2h-wait")

    def line(self, wall: float) -> str:
        return ", ".join(f"{k} {v:.2f}s ({v / wall:.0%} of extract wall)" for k, v in sorted(self.seconds.items()))


@dataclass
class Meter:
    """Tokens, wall seconds and CPU seconds of this process (all threads). CPU time barely moves when
    other jobs share the cores, so it shows the work extraction adds even on a busy machine."""

    tokens: int = 0
    wall: float = 0.0
    cpu: float = 0.0
    _start: tuple[float, float] = field(default=(0.0, 0.0), repr=False)

    def start(self) -> None:
        self._start = (time.perf_counter(), time.process_time())

    def stop(self, tokens: int) -> None:
        self.tokens += tokens
        self.wall += time.perf_counter() - self._start[0]
        self.cpu += time.process_time() - self._start[1]

    @property
    def rate(self) -> float:
        return self.tokens / self.wall

    @property
    def cpu_rate(self) -> float:
        return self.tokens / self.cpu


def make_shards(n: int, shards: int, seq_len: int, vocab: int, seed: int = 0) -> list[list[dict[str, Any]]]:
    """Random token ids, lengths uniform in [seq_len/2, seq_len], dealt into `shards` shards."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        t = rng.randint(max(1, seq_len // 2), seq_len)
        ids = [rng.randrange(vocab) for _ in range(t)]
        rows.append({"sample_id": f"b{i:05d}", "input_ids": ids, "loss_mask": [1] * t, "num_tokens": t,
                     "source": f"bench:{i}", "messages": "[]"})  # fmt: skip
    return [rows[i::shards] for i in range(shards)]


def write_prepared(store: RunStore, shards: list[list[dict[str, Any]]], model_dir: Path) -> None:
    for i, rows in enumerate(shards):
        store.write_prepared_shard(i, pa.Table.from_pylist(rows, schema=PREPARED_SCHEMA))
    tokens = [sum(r["num_tokens"] for r in rows) for rows in shards]
    store.write_prepared_manifest(
        PreparedManifest(
            dataset="bench",
            dataset_fingerprint="bench",
            tokenizer_sha256=tokenizer_fingerprint(model_dir),
            num_samples=sum(len(rows) for rows in shards),
            num_tokens=sum(tokens),
            num_loss_tokens=sum(tokens),
            shards=[len(rows) for rows in shards],
            shard_tokens=tokens,
            config={},
        )
    )


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def plain_forward(engine: TransformersEngine, samples: list[PreparedSample]) -> None:
    """The base model over the engine's own batches, keeping only the last hidden state on the device."""
    base = engine.base_model()
    with rows_not_packed():  # the engine's own launch path, so the ceiling is as fast as the engine's forward can be
        for batch in length_batches(samples, engine.batch_tokens):
            base(input_ids=engine.input_ids(batch), use_cache=False)
    sync(engine.device)


@dataclass
class Result:
    forward: Meter
    extract: Meter
    bytes: int = 0
    limit_s: float = 0.0  # what the extraction would take at each shard's binding limit, summed
    probes: list[float] = field(default_factory=list)  # bytes/s of every write probe, in order
    write_bound_s: float = 0.0  # the part of limit_s where the disk, not the forward, was the limit


def measure(
    cfg: PipelineConfig, model_dir: Path, shards: list, engine: TransformersEngine, args: Any, work: Path, hidden: int
) -> Result:
    """Alternate forward, disk probe, extract_shard and disk probe shard by shard, `repeats` times over a fresh
    store. A shared VM's disk changes speed from minute to minute (it halved within one in session 7), so each
    shard's extraction is held against the disk as it was right around it: the shard's binding limit is
    min(its forward rate, the mean of its two probes / its bytes per token), and the extraction's limit is the
    time the shards would take at those limits."""
    res = Result(Meter(), Meter())
    store = RunStore(cfg.run_dir)
    for _ in range(args.repeats):
        shutil.rmtree(store.root, ignore_errors=True)
        write_prepared(store, shards, model_dir)
        info = open_run(cfg, store, model_dir, engine.info)
        res.bytes = 0
        for i in range(len(shards)):
            samples = store.prepared_samples(i)
            tokens = sum(len(s) for s in samples)
            sync(engine.device)
            forward_before = res.forward.wall
            res.forward.start()
            plain_forward(engine, samples)
            res.forward.stop(tokens)
            forward_s = res.forward.wall - forward_before
            probe = min(args.write_mb * MB, tokens * expected_bytes_per_token(engine, hidden, args.store_dtype))
            before = write_bandwidth(work / "bw", probe, PROBE_FILE, args.writer_threads)
            res.extract.start()
            m = extract_shard(store, i, engine, info, writer_threads=args.writer_threads)
            res.extract.stop(m.tokens)
            after = write_bandwidth(work / "bw", probe, PROBE_FILE, args.writer_threads)
            assert m.status == "complete", m.errors
            res.bytes += m.bytes
            res.probes += [before, after]
            disk_s = m.bytes / ((before + after) / 2)
            res.limit_s += max(forward_s, disk_s)
            res.write_bound_s += disk_s if disk_s > forward_s else 0.0
    return res


def expected_bytes_per_token(engine: TransformersEngine, hidden: int, store_dtype: str) -> int:
    """(K+1) x H x itemsize: what a probe should write to last about as long as a shard's extraction."""
    return (len(engine.info.aux_layers) + 1) * hidden * (1 if store_dtype == "float8_e4m3" else 2)


def main() -> None:
    args = parse_args()
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    model_dir = resolve_model(args.model, Path(args.data_dir))
    facts = read_model_facts(model_dir)
    Path(args.work_dir).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=args.work_dir, prefix="extract-bench-"))
    engine = TransformersEngine(model_dir, device=args.device, dtype=args.dtype, batch_tokens=args.batch_tokens,
                                store_dtype=args.store_dtype, inflight=args.inflight)  # fmt: skip
    cfg = PipelineConfig.model_validate(
        {"run_dir": str(work / "run"), "model": str(model_dir), "extract": {"store_dtype": args.store_dtype},
         "server": {"device": args.device, "dtype": args.dtype, "batch_tokens": args.batch_tokens}}
    )  # fmt: skip
    prof = Profile()
    try:
        shards = make_shards(args.samples, args.shards, args.seq_len, facts.vocab_size)
        warm = [PreparedSample(r["sample_id"], r["input_ids"], r["loss_mask"], "") for r in shards[0]]
        plain_forward(engine, warm)  # load + warm up
        list(engine.extract(warm))
        prof.install()
        res = measure(cfg, model_dir, shards, engine, args, work, facts.hidden_size)
        bw_large = write_bandwidth(work / "bw-large", args.write_mb * MB, PROBE_FILE, args.writer_threads)
        sample_size = res.bytes // args.samples
        small_total = min(args.write_mb * MB, max(64 * MB, 200 * sample_size))
        bw_sample = write_bandwidth(work / "bw-sample", small_total, sample_size, args.writer_threads)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(header(args, engine, facts, res.extract.tokens // args.repeats))
    print(table(args, facts, len(engine.info.aux_layers), res, bw_large, bw_sample, sample_size))
    print(f"\nhost-time profile: {prof.line(res.extract.wall)}")


def header(args: Any, engine: TransformersEngine, facts: ModelFacts, tokens: int) -> str:
    v = library_versions()
    device = torch.cuda.get_device_name(engine.device) if engine.device.type == "cuda" else f"cpu x{os.cpu_count()}"
    return (
        f"model {facts.model_type} {facts.num_layers} layers, hidden {facts.hidden_size}, {args.dtype}; "
        f"device {device}; {args.samples} samples in {args.shards} shards, {tokens} tokens per pass "
        f"(lengths {args.seq_len // 2}..{args.seq_len}), {args.repeats} passes, batch_tokens {args.batch_tokens}, "
        f"writer threads {args.writer_threads}, inflight {args.inflight}, "
        f"switch interval {sys.getswitchinterval() * 1e3:g} ms, K={len(engine.info.aux_layers)}; "
        f"torch {v.get('torch')}, transformers {v.get('transformers')}\n"
    )


def table(args: Any, facts: ModelFacts, k: int, res: Result, bw_large: float, bw_sample: float, size: int) -> str:
    itemsize = 2  # the bf16 minimum, whatever the store dtype
    minimum = (k + 1) * facts.hidden_size * itemsize
    target = "<= 0.51" if args.store_dtype == "float8_e4m3" else "<= 1.02"
    bpt = res.bytes / (res.extract.tokens / args.repeats)
    fwd, ext = res.forward, res.extract
    binding = ext.tokens / res.limit_s  # tok/s at each shard's own limit, over all shards
    probes = f"{min(res.probes) / MB:,.0f}-{max(res.probes) / MB:,.0f} MiB/s"
    bound = f"write-bound {res.write_bound_s / res.limit_s:.0%} of the time"
    rows = [
        ("plain forward (no capture, no write)", f"{fwd.rate:,.0f} tok/s", f"{fwd.cpu_rate:,.0f} tok per CPU-s"),
        ("extraction (capture + write, extract_shard)", f"{ext.rate:,.0f} tok/s", f"{ext.cpu_rate:,.0f} tok per CPU-s"),
        ("write probes around each shard, 64 MiB files + fsync", probes,
         f"{len(res.probes)} probes, {args.writer_threads} threads"),
        ("write bandwidth after the run, 64 MiB files + fsync", f"{bw_large / MB:,.0f} MiB/s",
         f"= {bw_large / bpt:,.0f} tok/s"),
        (f"write bandwidth, {size / MB:.2f} MiB files + fsync", f"{bw_sample / MB:,.0f} MiB/s",
         f"{args.writer_threads} threads"),
        ("bytes/token on disk", f"{bpt:,.1f}", f"minimum (K+1)·H·{itemsize} = {minimum:,}"),
        ("binding limit: per shard min(forward, probes' mean / bytes_per_token)", f"{binding:,.0f} tok/s", bound),
        ("**extraction / binding limit** (target >= 0.9)", f"**{ext.rate / binding:.3f}**",
         f"CPU-time ratio {ext.cpu_rate / fwd.cpu_rate:.3f}"),
        (f"**bytes per token / bf16 minimum** (target {target})", f"**{bpt / minimum:.4f}**", ""),
    ]  # fmt: skip
    lines = ["| measure | value | note |", "| --- | --- | --- |"]
    lines += [f"| {name} | {value} | {note} |" for name, value, note in rows]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
