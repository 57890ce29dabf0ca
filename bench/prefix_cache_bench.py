"""Multi-turn synthesize through SGLang with the prefix cache off (the default) and on (server.prefix_cache).

    .venv/bin/python bench/prefix_cache_bench.py [--samples 16] [--user-turns 3] [--max-new-tokens 48]

The first `--samples` demo prompts, each grown by `--user-turns` pairs of a user turn and an answer the target
writes (synthesize.user_turns): every turn's request holds the whole conversation so far. One plain SGLang server
per setting (the same flags otherwise, --skip-tokenizer-init), greedy, synthesize.concurrency 8, each setting into
a fresh run directory; the settings' order alternates per repeat. Reports what the stage's summary counts: the
prompt tokens sent, those the prefix cache served, the prompt tokens the server computed (the difference), and
generated tokens per second of the generation phase. The token counts are exact; the seconds are this machine's.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eagle3.config import PipelineConfig
from eagle3.data.synthesize import open_servers, synthesize
from eagle3.store.run_store import RunStore
from eagle3.target.demo import resolve_model


def config(run_dir: Path, model: Path, a: argparse.Namespace, prefix_cache: bool) -> PipelineConfig:
    return PipelineConfig.model_validate(
        {
            "run_dir": str(run_dir),
            "model": str(model),
            "data": {"dataset": str(Path(a.prompts).resolve()), "max_samples": a.samples, "max_length": 4096,
                     "shard_size": 1000},
            "synthesize": {"max_new_tokens": a.max_new_tokens, "temperature": 0.0, "concurrency": 8,
                           "user_turns": a.user_turns},
            "server": {"engine": "sglang", "device": "cpu", "dtype": "bfloat16", "python": os.path.abspath(a.python),
                       "port": a.port, "max_total_tokens": a.max_total_tokens, "prefix_cache": prefix_cache},
        }
    )  # fmt: skip


def run(a: argparse.Namespace, model: Path, tmp: Path, prefix_cache: bool, rep: int) -> dict[str, Any]:
    cfg = config(tmp / f"run-{prefix_cache}-{rep}", model, a, prefix_cache)
    (server,) = open_servers(cfg, model, dict(os.environ), tmp / f"server-{prefix_cache}-{rep}")
    server.start()
    try:
        s = synthesize(cfg, RunStore(cfg.run_dir), model, servers=[server]).summary
    finally:
        server.stop()
    computed = s.prompt_tokens - s.cached_prompt_tokens
    print(f"prefix_cache={prefix_cache} rep {rep}: {s.prompt_tokens} prompt tokens, {s.cached_prompt_tokens} "
          f"cached, {computed} computed; {s.tokens} generated in {s.elapsed_s:.1f} s", flush=True)  # fmt: skip
    return {"prompt": s.prompt_tokens, "cached": s.cached_prompt_tokens, "computed": computed,
            "generated": s.tokens, "elapsed_s": s.elapsed_s}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="demo")
    ap.add_argument("--prompts", default="data/demo_prompts.jsonl")
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--user-turns", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--python", default=".venv-sglang/bin/python")
    ap.add_argument("--port", type=int, default=31187)
    ap.add_argument("--max-total-tokens", type=int, default=16384)
    a = ap.parse_args()
    model = resolve_model(a.model, Path("data"))
    tmp = Path(tempfile.mkdtemp(prefix="prefix-cache-bench-"))
    results: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    for rep in range(a.repeats):
        for on in (False, True) if rep % 2 == 0 else (True, False):
            results[on].append(run(a, model, tmp, on, rep))
    print("\n| server.prefix_cache | prompt tokens sent | served by the cache | computed | generated tok/s (best) |")
    print("|---|---:|---:|---:|---:|")
    for on, rs in results.items():
        r = rs[0]
        best = max(x["generated"] / x["elapsed_s"] for x in rs)
        print(f"| {'on' if on else 'off'} | {r['prompt']} | {r['cached']} | {r['computed']} | {best:.1f} |")
    off, on_ = results[False][0], results[True][0]
    print(f"\ncomputed prompt tokens: {on_['computed'] / off['computed']:.3f}x of the cache-off run's")


if __name__ == "__main__":
    main()
