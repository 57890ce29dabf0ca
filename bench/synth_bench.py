"""synthesize through SGLang vs a bare concurrent client on the same server, and vs in-process transformers.

    .venv/bin/python bench/synth_bench.py [--samples 64] [--c1-samples 16] [--max-new-tokens 64]
                      [--concurrency 1 16 64] [--repeats 2] [--transformers-batch 8 64] [--out bench.json]

One plain SGLang server (server.python, default .venv-sglang; --skip-tokenizer-init, radix cache off, as the
pipeline launches it). The first `--samples` demo prompts (`--c1-samples` of them at concurrency 1: its tok/s
needs few, and takes long), greedy, `--max-new-tokens` each. Per concurrency c, passes interleave, their order
alternating per repeat (the CPU here is shared, so noise hits both): "bare" is an asyncio httpx client keeping
c `/generate` requests in flight with the same token ids and sampling params; "stage" is
eagle3.data.synthesize.synthesize with synthesize.concurrency = c into a fresh run directory (its rendering,
tokenizing, per-sample checkpoints, retries, progress). tok/s = generated tokens (stop token included) / wall
seconds of the generation phase (the stage: its own counter, which starts after prepare; "whole call" adds
prepare and the tokenize step). Best of `--repeats`. Then the in-process transformers synthesize
(server.engine transformers) at each `--transformers-batch`. Prints a markdown table for docs/performance.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eagle3.config import PipelineConfig
from eagle3.data.chat import ChatTokenizer, normalize_row
from eagle3.data.generate import prompt_ids, stop_token_ids_of
from eagle3.data.synthesize import open_servers, synthesize
from eagle3.store.run_store import RunStore
from eagle3.target.demo import resolve_model


def config(
    run_dir: Path, model: Path, dataset: Path, n: int, new: int, conc: int, engine: str, **kw: Any
) -> PipelineConfig:
    server: dict[str, Any] = {"engine": engine, "device": "cpu", "dtype": "bfloat16"}
    if engine == "sglang":
        server |= {"python": kw["python"], "port": kw["port"], "max_total_tokens": kw["max_total_tokens"]}
    return PipelineConfig.model_validate(
        {
            "run_dir": str(run_dir),
            "model": str(model),
            "data": {"dataset": str(dataset), "max_samples": n, "max_length": 2048, "shard_size": 1000},
            "synthesize": {"max_new_tokens": new, "temperature": 0.0, "concurrency": conc,
                           "batch_size": kw.get("batch", 8)},
            "server": server,
        }
    )  # fmt: skip


async def bare(url: str, prompts: list[list[int]], params: dict[str, Any], conc: int) -> tuple[int, float]:
    """c requests in flight, no checkpoints: generated tokens and wall seconds."""
    sem = asyncio.Semaphore(conc)
    limits = httpx.Limits(max_connections=conc + 8, max_keepalive_connections=conc + 8)
    async with httpx.AsyncClient(limits=limits, timeout=3600) as client:

        async def one(i: int, ids: list[int]) -> int:
            async with sem:
                r = await client.post(
                    f"{url}/generate",
                    json={"input_ids": ids, "rid": f"bare-{time.time_ns()}-{i}", "sampling_params": params},
                )
                r.raise_for_status()
                return int(r.json()["meta_info"]["completion_tokens"])

        t0 = time.perf_counter()
        tokens = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
        return sum(tokens), time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="demo")
    ap.add_argument("--prompts", default="data/demo_prompts.jsonl")
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--c1-samples", type=int, default=16, help="prompts at concurrency 1 (its tok/s needs few)")
    ap.add_argument("--transformers-batch", type=int, nargs="*", default=[8, 64])
    ap.add_argument("--python", default=".venv-sglang/bin/python")
    ap.add_argument("--port", type=int, default=31177)
    ap.add_argument("--max-total-tokens", type=int, default=16384)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()

    model = resolve_model(a.model, Path("data"))
    dataset = Path(a.prompts).resolve()
    chat = ChatTokenizer.from_model_dir(model)
    rows = [json.loads(line) for line in dataset.read_text().splitlines() if line.strip()][: a.samples]
    prompts = []
    for row in rows:
        msgs = normalize_row(row)
        first = next(i for i, m in enumerate(msgs) if m["role"] == "assistant")
        prompts.append(prompt_ids(chat, msgs[:first]))  # the demo rows have one assistant turn
    params = {"max_new_tokens": a.max_new_tokens, "temperature": 0.0, "stop_token_ids": stop_token_ids_of(model, chat)}
    kw = {"python": os.path.abspath(a.python), "port": a.port, "max_total_tokens": a.max_total_tokens}
    tmp = Path(tempfile.mkdtemp(prefix="synth-bench-"))
    results: dict[str, Any] = {
        "samples": a.samples,
        "max_new_tokens": a.max_new_tokens,
        "sglang": {},
        "transformers": {},
    }
    base = config(tmp / "base", model, dataset, a.samples, a.max_new_tokens, 1, "sglang", **kw)
    (server,) = open_servers(base, model, dict(os.environ), tmp / "server")
    server.start()
    try:
        asyncio.run(bare(server.url, prompts[:4], params, 4))  # warm-up
        for conc in a.concurrency:
            best: dict[str, tuple[float, int, float]] = {}
            pairs: list[float] = []  # stage / bare of each repeat: adjacent passes share the machine's load
            n = a.c1_samples if conc == 1 else a.samples
            for rep in range(a.repeats):
                for which in ("bare", "stage") if rep % 2 == 0 else ("stage", "bare"):  # alternate the order
                    if which == "bare":
                        tokens, wall = asyncio.run(bare(server.url, prompts[:n], params, conc))
                        best["bare"] = max(best.get("bare", (0.0, 0, 0.0)), (tokens / wall, tokens, wall))
                        continue
                    cfg = config(tmp / f"stage-{conc}-{rep}", model, dataset, n, a.max_new_tokens, conc, "sglang", **kw)
                    t0 = time.perf_counter()
                    out = synthesize(cfg, RunStore(cfg.run_dir), model, servers=[server])
                    whole = time.perf_counter() - t0
                    s = out.summary
                    best["stage"] = max(
                        best.get("stage", (0.0, 0, 0.0)), (s.tokens / s.elapsed_s, s.tokens, s.elapsed_s)
                    )
                    best["stage_whole"] = max(
                        best.get("stage_whole", (0.0, 0, 0.0)), (s.tokens / whole, s.tokens, whole)
                    )
                pairs.append((s.tokens / s.elapsed_s) / (tokens / wall))
                print(f"c={conc} ({n} prompts) rep {rep}: bare {tokens / wall:.1f} tok/s, stage "
                      f"{s.tokens / s.elapsed_s:.1f} (whole call {s.tokens / whole:.1f})", flush=True)  # fmt: skip
            results["sglang"][conc] = {k: {"tok_s": v[0], "tokens": v[1], "wall_s": v[2]} for k, v in best.items()}
            results["sglang"][conc]["paired"] = {"ratios": pairs, "median": statistics.median(pairs)}
    finally:
        server.stop()
    for batch in a.transformers_batch:
        cfg = config(tmp / f"tf-{batch}", model, dataset, a.samples, a.max_new_tokens, 1, "transformers", batch=batch)
        t0 = time.perf_counter()
        out = synthesize(cfg, RunStore(cfg.run_dir), model)
        whole = time.perf_counter() - t0
        s = out.summary
        results["transformers"][batch] = {"tok_s": s.tokens / s.elapsed_s, "tokens": s.tokens, "wall_s": s.elapsed_s,
                                          "whole_tok_s": s.tokens / whole}  # fmt: skip
        print(f"transformers batch {batch}: {s.tokens / s.elapsed_s:.1f} tok/s", flush=True)

    one = results["sglang"].get(1, {}).get("stage", {}).get("tok_s")
    print(
        "\n| engine | in flight | bare client tok/s | stage tok/s | stage / bare (best) | stage / bare "
        "(median of pairs) | vs stage at 1 | whole call tok/s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for conc, r in results["sglang"].items():
        st, br = r["stage"]["tok_s"], r["bare"]["tok_s"]
        speed = f"{st / one:.2f}x" if one else "-"
        med = r["paired"]["median"]
        print(f"| sglang | {conc} | {br:.1f} | {st:.1f} | {st / br:.2f} | {med:.2f} | {speed} | "
              f"{r['stage_whole']['tok_s']:.1f} |")  # fmt: skip
    for batch, r in results["transformers"].items():
        tps, whole_tps = r["tok_s"], r["whole_tok_s"]
        print(f"| transformers (in-process) | batch {batch} | - | {tps:.1f} | - | - | - | {whole_tps:.1f} |")
    if a.out:
        a.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
