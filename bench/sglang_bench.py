"""Extraction through SGLang with the hook vs the same server's plain prefill, at window 1 and 4.

    .venv/bin/python bench/sglang_bench.py [--samples 24] [--tokens 256] [--repeats 3] [--windows 1 4]

Two servers of the same SGLang (server.python, default .venv-sglang), up together: one plain (no capture
flags, plugin inert), one with the capture flags and the hook (EAGLE3_DUMP_DIR set). The same requests
(`max_new_tokens: 0`) go three ways: "plain prefill" POSTs to the plain server; "capture on, not dumped"
POSTs to the hooked server with rids the hook ignores (the cost of SGLang's capture-only mode);
"hook + client" is the real extraction client (request file, /generate, wait for the dump, header + ids +
mask check), so it adds the copy off the device, the write with fsync and the client's checks. Passes
interleave per group of `window` samples (the CPU here is shared); each group counts its best of
`--repeats`, after a warm-up.
The CPU columns add the user + system seconds of the serving server's process group (scheduler, hook,
writer thread) and of this client process (best of 2 more runs per group): a view the load of other
jobs on a shared machine inflates far less than wall time. Prints a markdown table for docs/performance.md.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eagle3.config import PipelineConfig
from eagle3.extract.engines.base import Dumped
from eagle3.extract.engines.sglang_engine import SGLangEngine
from eagle3.serving.layers import extraction_layers
from eagle3.serving.server import SGLangServer
from eagle3.store.run_store import PreparedSample
from eagle3.target.demo import resolve_model
from eagle3.target.files import read_model_facts


def make_samples(model_dir: Path, prompts: Path, n: int, tokens: int) -> list[PreparedSample]:
    """Chats of about `tokens` tokens: consecutive demo conversations joined into one multi-turn chat."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    rows = [json.loads(line)["messages"] for line in prompts.read_text().splitlines() if line.strip()]
    out: list[PreparedSample] = []
    i = 0
    while len(out) < n:
        messages: list[dict[str, str]] = []
        ids: list[int] = []
        while len(ids) < tokens:
            messages += rows[i % len(rows)]
            i += 1
            enc: Any = tok.apply_chat_template(messages, tokenize=True, return_dict=True)
            ids = [int(x) for x in enc["input_ids"]]
        out.append(PreparedSample(f"b{len(out):04d}", ids, [1] * len(ids), "bench"))
    return out


def _clock(fn) -> float:  # type: ignore[no-untyped-def]
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def group_cpu_s(pgid: int) -> float:
    """User + system CPU seconds of every live process in a process group (the server and its scheduler,
    where the hook and its writer thread run): a view of the cost that other jobs' load does not inflate."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # fields after "(comm)": state ppid pgrp ... utime(11) stime(12)
            total += int(fields[11]) + int(fields[12])
    return total / tick


def _cpu(fn, pgid: int) -> float:  # type: ignore[no-untyped-def]
    """CPU seconds of the server group plus this (client) process while fn runs."""
    before, mine = group_cpu_s(pgid), os.times()
    fn()
    after = os.times()
    return group_cpu_s(pgid) - before + (after.user - mine.user) + (after.system - mine.system)


def plain_pass(url: str, samples: list[PreparedSample], window: int) -> None:
    def one(s: PreparedSample) -> None:
        body = {"input_ids": s.input_ids, "rid": f"bench-{s.sample_id}", "sampling_params": {"max_new_tokens": 0}}
        r = httpx.post(f"{url}/generate", json=body, timeout=600)
        r.raise_for_status()
        assert r.json()["meta_info"]["prompt_tokens"] == len(s)

    with cf.ThreadPoolExecutor(window) as pool:
        list(pool.map(one, samples))


def hook_pass(engine: SGLangEngine, samples: list[PreparedSample]) -> None:
    for o in engine.extract(samples):
        assert isinstance(o, Dumped), getattr(o, "reason", o)
        o.path.unlink()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="demo")
    ap.add_argument("--prompts", default="data/demo_prompts.jsonl")
    ap.add_argument("--samples", type=int, default=24)
    ap.add_argument("--tokens", type=int, default=256, help="approximate tokens per sample")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--windows", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--port", type=int, default=30911)
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="sglang-bench-"))
    server_cfg = {"engine": "sglang", "device": args.device, "port": args.port}
    if args.device == "cpu":
        server_cfg["max_total_tokens"] = 16384
    cfg = PipelineConfig.model_validate({"run_dir": str(work / "run"), "model": args.model, "server": server_cfg})
    model_dir = resolve_model(cfg.model, Path(cfg.data_dir))
    facts = read_model_facts(model_dir)
    layers = extraction_layers(model_dir, cfg.extract)  # EAGLE-3's default aux layers
    samples = make_samples(model_dir, Path(args.prompts), args.samples, args.tokens)
    total = sum(len(s) for s in samples)
    env = dict(os.environ)
    dump_dir = work / "dump"
    plain = SGLangServer(cfg.server, model_dir, dump_dir=None, layers=None, log_dir=work / "plain", base_env=env)
    hooked = SGLangServer(
        cfg.server, model_dir, dump_dir=dump_dir, layers=layers, log_dir=work / "hook", base_env=env,
        port=args.port + 1,
    )  # fmt: skip
    best: dict[tuple[str, int], float] = {}
    cpu: dict[tuple[str, int], float] = {}
    with plain, hooked:  # both up; passes interleave so load drift on a shared CPU hits every mode alike
        for w in args.windows:
            c = cfg.model_copy(deep=True)
            c.extract.window = w
            engine = SGLangEngine(c, model_dir, f"bench{w}", dump_dir, server=hooked)
            modes = {
                "plain prefill": lambda g, w=w: plain_pass(plain.url, g, w),
                "capture on, not dumped": lambda g, w=w: plain_pass(hooked.url, g, w),
                "hook + client": lambda g, e=engine: hook_pass(e, g),
            }
            for run in modes.values():
                run(samples[: 2 * w])  # warm-up
            # Interleave per group of `w` samples (one window's worth): the three modes see the same
            # moment's load on a shared CPU; each group counts its best of the repeats.
            assert plain.pgid is not None and hooked.pgid is not None
            pgid = {"plain prefill": plain.pgid, "capture on, not dumped": hooked.pgid, "hook + client": hooked.pgid}
            for mode in modes:
                best[(mode, w)] = 0.0
                cpu[(mode, w)] = 0.0
            for i in range(0, len(samples), w):
                group = samples[i : i + w]
                for mode, run in modes.items():
                    best[(mode, w)] += min(_clock(lambda run=run, g=group: run(g)) for _ in range(args.repeats))
                    cpu[(mode, w)] += min(_cpu(lambda run=run, g=group: run(g), pgid[mode]) for _ in range(2))
    results = best

    shape = f"{facts.model_type} {facts.num_layers} layers hidden {facts.hidden_size}"
    print(f"\n{len(samples)} samples, {total} tokens ({total / len(samples):.0f}/sample), {shape}, ", end="")
    print(f"device {args.device}, best of {args.repeats}\n")
    print("| mode | window | seconds | tokens/s | overhead vs plain | CPU-s (server + client) | CPU overhead |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    order = ["plain prefill", "capture on, not dumped", "hook + client"]
    for (mode, w), sec in sorted(results.items(), key=lambda kv: (kv[0][1], order.index(kv[0][0]))):
        base, base_cpu = results[("plain prefill", w)], cpu[("plain prefill", w)]
        over = f"{100 * (sec / base - 1):+.1f}%" if mode != "plain prefill" else ""
        cpu_over = f"{100 * (cpu[(mode, w)] / base_cpu - 1):+.1f}%" if mode != "plain prefill" else ""
        print(f"| {mode} | {w} | {sec:.2f} | {total / sec:.0f} | {over} | {cpu[(mode, w)]:.2f} | {cpu_over} |")


if __name__ == "__main__":
    main()
