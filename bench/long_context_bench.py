"""Peak memory per 1K tokens of one long sample, for extraction (transformers engine) and training, on the CPU.

    .venv/bin/python bench/long_context_bench.py [--tokens 2048 8192 16384 32768] [--keep DIR]

For each length, one agentic conversation of at most that many tokens (tool calls and long tool results, four short
samples beside it) goes through prepare -> extract -> convert -> train (trained whole in a longer step) -> export
on a copy of the tiny Qwen3 whose context is the longest length (tests/long_samples.py, the same run as
tests/integration/test_long_context.py at 8.5K). Extraction and training each run in a process of their own, with
one intra-op thread, and report their peak resident memory above the process once its model is built. Prints one
JSON line per length; the figures are in docs/performance.md (long samples).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eagle3.target.tiny import ensure_tiny_model
from tests.long_samples import REPO, run_long_sample, target_with_context

#: tests.long_samples.long_conversation on the tiny Qwen3's tokenizer: about 1,420 tokens a round, 130 around them
TOKENS_PER_ROUND, TOKENS_AROUND = 1420, 130


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, nargs="+", default=[2048, 8192, 16384, 32768])
    ap.add_argument("--keep", type=Path, help="work here and keep the runs (default: a temporary directory)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        context = max(args.tokens)
        model = target_with_context(ensure_tiny_model(REPO / "data", "Qwen3ForCausalLM"), root / "target", context)
        for want in args.tokens:
            work = root / f"run-{want}"
            work.mkdir()
            run = run_long_sample(model, work, turns=max(1, (want - TOKENS_AROUND) // TOKENS_PER_ROUND))
            k = run.tokens / 1000
            print(json.dumps({
                "tokens": run.tokens, "trained_whole": run.trained == run.tokens,
                "extract_peak_mb": round(run.extract_mb), "extract_mb_per_1k": round(run.extract_mb / k, 1),
                "train_peak_mb": round(run.train_mb), "train_mb_per_1k": round(run.train_mb / k, 1),
                "seconds": {s: round(v, 1) for s, v in run.seconds.items()},
            }), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
