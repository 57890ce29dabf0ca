"""The quality run (issues #6, #18, #19): build the training data with the target, extract its hidden states,
convert, train the EAGLE-3 draft, and measure offline acceptance (k-step chain, greedy, float32 target) on
evaluation sets no training prompt comes from. The library's own stages, without Prefect; each stage skips what
is already done, so a killed run continues where it stopped.

Two ways to say what to run:

    # the template corpus (bench/quality_prompts.py): 30 instruction templates x topics, held-out topics
    python bench/quality_run.py --root /tmp/q --train-prompts 3000 --heldout 50 --epochs 6          # on a GPU
    python bench/quality_run.py --root /tmp/q --train-prompts 40 --heldout 4 --tiny                  # CPU smoke

    # a pipeline config, exactly the stages and keys `eagle3 run` would use (here: the varied corpus, prompts
    # stage included), with --set overrides; its evaluate.sets are the evaluation sets
    python bench/quality_run.py --root /tmp/v --config configs/varied-corpus.yaml --set prompts.self_instruct=2500

Variants on the same data (issue #19's bf16 vs FP8; issue #18's training choices): `--reuse-data ROOT` takes
ROOT's prompts, prepared and synthesized data (nothing regenerated) and runs extract onwards in this root:

    python bench/quality_run.py --root /tmp/v8 --config ... --reuse-data /tmp/v --set extract.store_dtype=float8_e4m3

`--train-name NAME` trains a variant of an extracted store (another seed, learning rate or TTT length) into
run/train-NAME beside the first, with no second store. `--until train` stops after training; `--eval-only
NAME[,NAME]` evaluates only those sets (several processes can evaluate one draft at once, each writing
eval/offline-<names>.json); `--checkpoint N` evaluates step N's checkpoint instead of the last (an epoch curve).
Prints one JSON line per stage and a final table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from quality_prompts import HELDOUT_TOPICS, TEMPLATES, TOPICS, build, write

from eagle3.config import PipelineConfig, load_config
from eagle3.convert import convert
from eagle3.data.chat import ChatTokenizer
from eagle3.data.prepare import prepare
from eagle3.data.prompts import build_prompts, corpus_path
from eagle3.data.synthesize import synthesize
from eagle3.draft.checkpoint import resolve_checkpoint, step_dir
from eagle3.evaluate.offline import evaluate_offline, load_eval_sets
from eagle3.extract.engines import build_engine
from eagle3.extract.shard import extract_shard, open_run
from eagle3.progress import Progress
from eagle3.store.paths import RunPaths, TrainPaths
from eagle3.store.run_store import RunStore
from eagle3.target.demo import resolve_model
from eagle3.train.job import TrainJob
from eagle3.train.trainer import Trainer

REPO = Path(__file__).resolve().parents[1]
STAGES = ["prompts", "prepare", "synthesize", "extract", "convert", "train", "evaluate"]


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


def template_overrides(args: argparse.Namespace, root: Path) -> list[str]:
    """The template corpus as config keys: its prompts files, the held-out template set and the varied set."""
    extra = [s.split("=", 1) for s in (args.eval_set or [f"varied={REPO / 'data/eval_varied_prompts.jsonl'}"])]
    sets = [{"name": "held-out", "dataset": str(root / "prompts" / "heldout.jsonl"), "kind": "template held-out",
             "num_prompts": args.heldout}]  # fmt: skip
    sets += [{"name": name, "dataset": path, "kind": name} for name, path in extra]
    train = {"epochs": args.epochs, "lr": args.lr, "warmup_steps": 20, "ttt_steps": args.ttt_steps,
             "batch_tokens": args.batch_tokens, "log_every": 20, "checkpoint_every": args.checkpoint_every,
             "min_lr_ratio": 0.1, **({"max_steps": 4, "batch_tokens": 512} if args.tiny else {})}  # fmt: skip
    sections = {
        "stages": ["prepare", "synthesize", "extract", "convert", "train", "evaluate"],
        "data": {"dataset": str(root / "prompts" / "train.jsonl"), "max_length": 1024, "shard_size": 1000},
        "synthesize": {"max_new_tokens": args.max_new_tokens,
                       **({"batch_size": args.synth_batch} if args.synth_batch else {})},
        "extract": {"store_dtype": args.store_dtype},
        "train": train,
        "evaluate": {"sets": sets, "draft_steps": args.draft_steps, "compare_steps": [args.draft_steps],
                     "max_new_tokens": args.eval_new_tokens},
    }  # fmt: skip
    return [f"{key}={json.dumps(value)}" for key, value in sections.items()]


def build_config(args: argparse.Namespace, root: Path, cuda: bool) -> PipelineConfig:
    """The run's config: --config (or the template corpus) + --set, with this root's run_dir and the device."""
    device = "cuda" if cuda else "cpu"
    placed = [
        f"run_dir={root / 'run'}",
        f"data_dir={args.data_dir}",
        f"server.device={device}",
        f"train.device={device}",
        f"evaluate.device={device}",
        f"server.batch_tokens={65536 if cuda else 4096}",
        *(["train.precision=fp32"] if not cuda else []),
    ]
    base = [] if args.config else template_overrides(args, root)
    cfg = load_config(args.config, [*base, *placed, *(args.set or [])])
    if "prompts" in cfg.stages:  # the prompts stage writes the corpus that prepare reads: this root's
        cfg = load_config(args.config, [*base, *placed, *(args.set or []), f"data.dataset={corpus_path(cfg)}"])
    return cfg


def reuse_data(args: argparse.Namespace, cfg: PipelineConfig, cuda: bool) -> PipelineConfig:
    """Take --reuse-data's prepared and synthesized data: same dataset path, so both stages find them current."""
    src_root: Path = args.reuse_data
    src = build_config(args, src_root, cuda)
    for part in ("prepared", "synthesized"):
        here, there = Path(cfg.run_dir) / part, Path(src.run_dir) / part
        if not here.exists() and there.exists():
            shutil.copytree(there, here)
    stages = [s for s in cfg.stages if s != "prompts"]
    return cfg.model_copy(update={"stages": stages, "data": cfg.data.model_copy(update={"dataset": src.data.dataset})})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, required=True)
    ap.add_argument("--config", type=Path, default=None, help="a pipeline config (default: the template corpus)")
    ap.add_argument("--set", action="append", default=None, metavar="KEY=VALUE", help="config override")
    ap.add_argument("--data-dir", type=Path, default=REPO / "data", help="where the demo model is installed")
    ap.add_argument("--until", choices=STAGES, default="evaluate", help="the last stage to run")
    ap.add_argument("--eval-only", default=None, help="comma-separated evaluation set names")
    ap.add_argument("--checkpoint", type=int, default=None, help="evaluate this step's checkpoint (default: last)")
    ap.add_argument(
        "--train-name", default=None,
        help="train (and evaluate) a variant of an extracted store into run/train-NAME: only train and evaluate run",
    )  # fmt: skip
    ap.add_argument("--tiny", action="store_true", help="CPU smoke test: fp32, dense attention, few steps")
    ap.add_argument(
        "--reuse-data",
        type=Path,
        default=None,
        help="another root (same --config/--set data keys) whose prompts, prepared and synthesized data this takes",
    )
    template = ap.add_argument_group("the template corpus (without --config)")
    template.add_argument("--train-prompts", type=int, default=3000)
    template.add_argument("--heldout", type=int, default=50)
    template.add_argument("--max-new-tokens", type=int, default=192, help="synthesized answer length")
    template.add_argument("--eval-new-tokens", type=int, default=128)
    template.add_argument("--epochs", type=float, default=6.0)
    template.add_argument("--ttt-steps", type=int, default=7)
    template.add_argument("--lr", type=float, default=3e-4)
    template.add_argument("--batch-tokens", type=int, default=16384)
    template.add_argument("--draft-steps", type=int, default=3)
    template.add_argument("--synth-batch", type=int, help="prompts generated together (default: synthesize's own)")
    template.add_argument("--checkpoint-every", type=int, default=200, help="steps; a killed run resumes")
    template.add_argument("--store-dtype", default="bfloat16", choices=["bfloat16", "float8_e4m3"])
    template.add_argument(
        "--eval-set", action="append", default=None, metavar="NAME=PATH",
        help="an extra evaluation set (chat rows); default: varied=data/eval_varied_prompts.jsonl",
    )  # fmt: skip
    args = ap.parse_args()
    root: Path = args.root
    cuda = torch.cuda.is_available() and not args.tiny
    if args.config is None:
        for one in {root, args.reuse_data} - {None}:
            write(one / "prompts" / "train.jsonl", build(TEMPLATES, TOPICS, args.train_prompts, seed=0))
            write(one / "prompts" / "heldout.jsonl", build(TEMPLATES, HELDOUT_TOPICS, args.heldout, seed=1))
    cfg = build_config(args, root, cuda)
    if args.reuse_data is not None:
        cfg = reuse_data(args, cfg, cuda)
    todo = [s for s in cfg.stages if s in STAGES[: STAGES.index(args.until) + 1]]
    if args.train_name is not None:
        todo = [s for s in todo if s in ("train", "evaluate")]
    if args.eval_only is not None or args.checkpoint is not None:
        todo = ["evaluate"]
    store = RunStore(cfg.run_dir)
    out = Path(cfg.run_dir) / ("train" if args.train_name is None else f"train-{args.train_name}")
    results: dict[str, Any] = {"device": torch.cuda.get_device_name() if cuda else "cpu", "stages": todo}
    model_dir = resolve_model(cfg.model, Path(cfg.data_dir))
    if "prompts" in todo:
        with stage("prompts", results):
            s = build_prompts(cfg, model_dir, printer())
            results["prompts_summary"] = s.model_dump(mode="json", exclude={"examples_dropped", "failed"})
    if "prepare" in todo:
        with stage("prepare", results):
            prepare(cfg, store, model_dir, printer())
    if "synthesize" in todo:
        with stage("synthesize", results):
            manifest = synthesize(cfg, store, model_dir, printer()).manifest
            results["samples"], results["tokens"] = manifest.num_samples, manifest.num_tokens
    if "extract" in todo:
        with stage("extract", results):
            engine = build_engine(cfg, model_dir, base_env=os.environ)
            info = open_run(cfg, store, model_dir, engine.info)
            for shard in range(store.num_shards()):
                m = extract_shard(store, shard, engine, info, printer())
                assert m.status == "complete", f"shard {shard}: {m.status} {m.errors[:3]}"
            engine.close()
    if "convert" in todo:
        with stage("convert", results):
            c = convert(cfg, store, printer())
            results["draft_vocab_coverage"] = round(c.coverage, 4)
    if "train" in todo:
        with stage("train", results):
            job = TrainJob(train=cfg.train, run_dir=cfg.run_dir, model_dir=str(model_dir), out_dir=str(out),
                           device=cfg.train.device)  # fmt: skip
            with Trainer.build(job) as t:
                r = t.run(progress=printer(30.0))
            results["train_steps"], results["train_last"] = r.step, r.last_metrics
    if "evaluate" in todo:
        with stage("evaluate", results):
            results["sets"] = evaluate(cfg, args, model_dir, out)
    print(json.dumps({"result": results}), flush=True)
    print_tables(cfg, results)


def evaluate(cfg: PipelineConfig, args: argparse.Namespace, model_dir: Path, out: Path) -> dict[str, Any]:
    chat = ChatTokenizer.from_model_dir(model_dir)
    sets = load_eval_sets(cfg.evaluate, chat)
    if args.eval_only is not None:
        names = args.eval_only.split(",")
        sets = [s for s in sets if s.name in names]
        if len(sets) != len(names):
            raise SystemExit(f"--eval-only {args.eval_only}: the config's sets are {[s.name for s in sets]}")
    checkpoint = out if args.checkpoint is None else step_dir(TrainPaths(out).checkpoints_dir, args.checkpoint)
    tag = "-".join([*(s.name for s in sets), *([args.train_name] if args.train_name else [])])
    tag += "" if args.checkpoint is None else f"-step{args.checkpoint}"
    run_dir = Path(cfg.run_dir)
    ev = evaluate_offline(
        cfg.evaluate, run_dir, model_dir, resolve_checkpoint(checkpoint), sets=sets, progress=printer(),
        out=RunPaths(run_dir).offline_eval_json.with_name(f"offline-{tag}.json"),
    )  # fmt: skip
    return {
        f"{r.set_name} k={r.steps}": {
            "prompts": r.num_prompts,
            "acceptance_length": round(r.acceptance_length, 3),
            "position_rates": [None if p.rate is None else round(p.rate, 3) for p in r.positions],
            "identical_to_greedy": f"{r.identical_to_greedy}/{r.num_prompts}",
            "offline_speedup": round(r.speedup, 3),
            "checkpoint": r.checkpoint,
        }
        for r in ev.runs
    }


def print_tables(cfg: PipelineConfig, results: dict[str, Any]) -> None:
    if "train_last" in results:
        last = results["train_last"]
        print("\n| samples | tokens | steps | final loss | step-0 acc |")
        print("|---:|---:|---:|---:|---:|")
        print(f"| {results.get('samples', '')} | {results.get('tokens', '')} | {results['train_steps']} | "
              f"{last.get('loss', 0):.3f} | {last.get('step_acc', [0])[0]:.3f} |")  # fmt: skip
    if "sets" in results:
        print("\n| store dtype | set | prompts | acceptance length | per-position | identical to greedy | speed-up |")
        print("|---|---|---:|---:|---|---:|---:|")
        for name, r in results["sets"].items():
            print(f"| {cfg.extract.store_dtype} | {name} | {r['prompts']} | {r['acceptance_length']} | "
                  f"{r['position_rates']} | {r['identical_to_greedy']} | {r['offline_speedup']} |")  # fmt: skip


if __name__ == "__main__":
    main()
