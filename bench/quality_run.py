"""The quality run (issue #6): synthesize a few thousand conversations with SmolLM2-135M, extract their hidden
states, convert, train the EAGLE-3 draft, and measure offline acceptance (k-step chain, greedy) on held-out
prompts about topics no training prompt mentions. The library's own stages, without Prefect; each stage
skips what is already done, so a killed run continues where it stopped.

    python bench/quality_run.py --root /tmp/q --train-prompts 3000 --heldout 50 --epochs 6     # on a GPU
    python bench/quality_run.py --root /tmp/q --train-prompts 40 --heldout 4 --tiny               # CPU smoke test
    python bench/quality_run.py --root /tmp/q8 --reuse-data /tmp/q --store-dtype float8_e4m3 ...   # same data, FP8

Evaluates the held-out template prompts and every `--eval-set NAME=PATH` (default: the varied set,
data/eval_varied_prompts.jsonl), each on the same checkpoint, per position and per category.

Prints one JSON line per stage (seconds, counts) and a final table.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from quality_prompts import HELDOUT_TOPICS, TEMPLATES, TOPICS, build, write

from eagle3.chat import ChatTokenizer
from eagle3.config import PipelineConfig
from eagle3.convert import convert
from eagle3.engines import build_engine
from eagle3.evaluate.offline import load_eval_set, offline_sets, write_offline_result
from eagle3.extract import extract_shard, open_run
from eagle3.model_files import resolve_model
from eagle3.prepare import prepare
from eagle3.progress import Progress
from eagle3.store import RunStore
from eagle3.synthesize import synthesize
from eagle3.train.trainer import Trainer, TrainJob


def printer(every_s: float = 15.0) -> Any:
    last = [0.0]

    def report(p: Progress) -> None:
        if time.monotonic() - last[0] >= every_s or p.done >= p.total:
            last[0] = time.monotonic()
            print("  " + p.describe(), flush=True)

    return report


def stage(name: str, results: dict[str, Any]) -> Any:
    class _Timer:
        def __enter__(self) -> None:
            self.t0 = time.monotonic()
            print(f"== {name}", flush=True)

        def __exit__(self, *exc: object) -> None:
            results[name] = round(time.monotonic() - self.t0, 1)
            print(json.dumps({"stage": name, "seconds": results[name]}), flush=True)

    return _Timer()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", type=Path, required=True)
    ap.add_argument("--train-prompts", type=int, default=3000)
    ap.add_argument("--heldout", type=int, default=50)
    ap.add_argument("--max-new-tokens", type=int, default=192, help="synthesized answer length")
    ap.add_argument("--eval-new-tokens", type=int, default=128)
    ap.add_argument("--epochs", type=float, default=6.0)
    ap.add_argument("--ttt-steps", type=int, default=7)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--batch-tokens", type=int, default=16384)
    ap.add_argument("--draft-steps", type=int, default=3)
    ap.add_argument("--synth-batch", type=int, default=256, help="prompts generated together (GPU)")
    ap.add_argument("--checkpoint-every", type=int, default=200, help="steps; a killed run resumes from the last")
    ap.add_argument("--tiny", action="store_true", help="CPU smoke test: fp32, dense attention, few steps")
    ap.add_argument(
        "--store-dtype",
        default="bfloat16",
        choices=["bfloat16", "float8_e4m3"],
        help="extract.store_dtype (issue #19: run twice, same seed and prompts, and compare)",
    )
    ap.add_argument(
        "--reuse-data",
        type=Path,
        default=None,
        help="another root whose prompts, prepared and synthesized data this run takes (same data)",
    )
    ap.add_argument(
        "--eval-set",
        action="append",
        default=None,
        metavar="NAME=PATH",
        help="an extra evaluation set (chat rows); default: varied=data/eval_varied_prompts.jsonl",
    )
    args = ap.parse_args()
    root: Path = args.root
    if args.reuse_data is not None:
        for part in ("prompts", "run/prepared", "run/synthesized"):
            if not (root / part).exists() and (args.reuse_data / part).exists():
                shutil.copytree(args.reuse_data / part, root / part)
    repo = Path(__file__).resolve().parents[1]
    extra_sets = [s.split("=", 1) for s in (args.eval_set or [f"varied={repo / 'data/eval_varied_prompts.jsonl'}"])]
    write(root / "prompts" / "train.jsonl", build(TEMPLATES, TOPICS, args.train_prompts, seed=0))
    write(root / "prompts" / "heldout.jsonl", build(TEMPLATES, HELDOUT_TOPICS, args.heldout, seed=1))
    cuda = torch.cuda.is_available() and not args.tiny
    device = "cuda" if cuda else "cpu"  # every stage: server, train and evaluate
    cfg = PipelineConfig.model_validate(
        {
            "run_dir": str(root / "run"),
            "model": "demo",
            "data_dir": str(root / "data"),
            "stages": ["prepare", "synthesize", "extract", "convert", "train", "evaluate"],
            "data": {"dataset": str(root / "prompts" / "train.jsonl"), "max_length": 1024, "shard_size": 1000},
            "synthesize": {"max_new_tokens": args.max_new_tokens, "batch_size": args.synth_batch if cuda else 8},
            "extract": {"store_dtype": args.store_dtype},
            "server": {"engine": "transformers", "device": device,
                       "batch_tokens": 65536 if cuda else 4096},
            "train": {"device": device, "epochs": args.epochs, "lr": args.lr, "warmup_steps": 20,
                      "ttt_steps": args.ttt_steps,
                      "batch_tokens": args.batch_tokens, "log_every": 20, "checkpoint_every": args.checkpoint_every,
                      "min_lr_ratio": 0.1, "precision": "auto" if cuda else "fp32",
                      **({"max_steps": 4, "batch_tokens": 512} if args.tiny else {})},
            "evaluate": {"device": device, "dataset": str(root / "prompts" / "heldout.jsonl"),
                         "num_prompts": args.heldout,
                         "draft_steps": args.draft_steps, "max_new_tokens": args.eval_new_tokens},
        }
    )  # fmt: skip
    store = RunStore(cfg.run_dir)
    results: dict[str, Any] = {"device": torch.cuda.get_device_name() if cuda else "cpu"}
    with stage("model", results):
        model_dir = resolve_model(cfg.model, Path(cfg.data_dir))
    with stage("prepare", results):
        prepare(cfg, store, model_dir, printer())
    with stage("synthesize", results):
        manifest = synthesize(cfg, store, model_dir, printer()).manifest
        results["samples"], results["tokens"] = manifest.num_samples, manifest.num_tokens
    with stage("extract", results):
        engine = build_engine(cfg, model_dir)
        info = open_run(cfg, store, model_dir, engine.info)
        for shard in range(len(manifest.shards)):
            m = extract_shard(store, shard, engine, info, printer())
            assert m.status == "complete", f"shard {shard}: {m.status} {m.errors[:3]}"
        engine.close()
    with stage("convert", results):
        c = convert(cfg, store, printer())
        results["draft_vocab_coverage"] = round(c.coverage, 4)
    with stage("train", results):
        out = Path(cfg.run_dir) / "train"
        job = TrainJob(train=cfg.train, run_dir=cfg.run_dir, model_dir=str(model_dir), out_dir=str(out),
                       device=cfg.train.device)  # fmt: skip
        with Trainer.build(job) as t:
            r = t.run(progress=printer(30.0))
        results["train_steps"], results["train_last"] = r.step, r.last_metrics
    with stage("evaluate", results):
        chat = ChatTokenizer.from_model_dir(model_dir)
        sets = [load_eval_set("held-out", cfg.evaluate.dataset, chat, limit=cfg.evaluate.num_prompts, kind="template")]
        sets += [load_eval_set(name, path, chat, kind=name) for name, path in extra_sets]
        ev = offline_sets(
            model_dir, out, Path(cfg.run_dir), sets, chain_lengths=[cfg.evaluate.draft_steps],
            max_new_tokens=cfg.evaluate.max_new_tokens, device=cfg.evaluate.device, progress=printer(),
        )  # fmt: skip
        write_offline_result(Path(cfg.run_dir), ev)
        results["sets"] = {
            r.set_name: {
                "prompts": r.num_prompts,
                "acceptance_length": round(r.acceptance_length, 3),
                "position_rates": [None if p.rate is None else round(p.rate, 3) for p in r.positions],
                "identical_to_greedy": f"{r.identical_to_greedy}/{r.num_prompts}",
                "offline_speedup": round(r.speedup, 3),
            }
            for r in ev.runs
        }
        results["acceptance_length"] = results["sets"]["held-out"]["acceptance_length"]
        results["position_rates"] = results["sets"]["held-out"]["position_rates"]
        results["offline_speedup"] = results["sets"]["held-out"]["offline_speedup"]
    print(json.dumps({"result": results}), flush=True)
    last = results["train_last"]
    k = cfg.evaluate.draft_steps
    print(f"\n| samples | tokens | steps | final loss | step-0 acc | acceptance (k={k}) | per-position | speed-up |")
    print("|---:|---:|---:|---:|---:|---:|---|---:|")
    print(f"| {results['samples']} | {results['tokens']} | {results['train_steps']} | {last.get('loss', 0):.3f} | "
          f"{last.get('step_acc', [0])[0]:.3f} | {results['acceptance_length']} | {results['position_rates']} | "
          f"{results['offline_speedup']} |")  # fmt: skip
    print(f"\n| store dtype | set | prompts | acceptance (k={k}) | per-position | identical to greedy |")
    print("|---|---|---:|---:|---|---:|")
    for name, r in results["sets"].items():
        print(f"| {args.store_dtype} | {name} | {r['prompts']} | {r['acceptance_length']} | {r['position_rates']} | "
              f"{r['identical_to_greedy']} |")  # fmt: skip


if __name__ == "__main__":
    main()
