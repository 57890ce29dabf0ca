"""Our EAGLE-3 trainer side by side with the peers' own trainers on one store, on one machine, in one invocation.

    python bench/peers_bench.py [--root data/bench/peers] [--steps 24] [--peers speculators specforge]
    python bench/peers_bench.py --device cuda --speculators-python /tmp/peer/bin/python --peers speculators  # a GPU

The store is `make demo`'s (configs/demo.yaml: built once under <root>/store, bench/peers/demo_store.py). Each side
trains the same EAGLE-3 draft shape on the same training rows for the same steps, batch tokens, lr schedule and TTT
depth, each in its own process and environment (ours: .venv; a peer: .venv-<peer>, `make <peer>-env`):

    ours         bench/peers/ours.py              the library's Trainer
    speculators  bench/peers/speculators_peer.py  export_speculators -> `speculators train` -> import_speculators_draft
    specforge    bench/peers/specforge_peer.py    export_specforge -> `specforge train` -> export -> import_sglang_draft

Every draft is then measured by our code alone: the held-out loss and teacher-forced acceptance of our Trainer on the
store's held-out prompts (train.heldout_fraction, by prompt), and our offline evaluator (eagle3/evaluate/offline.py)
at k = 3 and 5 on demo.yaml's sets (varied, HumanEval, template held-out). It prints one table, then each side's
command and every setting that could not be made equal, and writes <root>/peers.json (and <root>/<side>/side.json:
`--reuse ours` prints a side from its side.json instead of training and measuring it again).

Columns: tok/s = training tokens per second after the first step, from the side's own step log; tok per CPU-s = the
same tokens per CPU second of the side's process (all threads; steadier on a shared machine); first step = seconds
from its process start to the end of its first optimizer step (imports, model and data set-up, the step); peak =
the process's peak RSS (and on CUDA torch's peak allocated on the GPU); held-out = our Trainer's loss / acceptance
length (k=3, teacher-forced) on the held-out rows; then offline acceptance length per set at k=3 / k=5.
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.peers.demo_store import demo_store
from bench.peers.ours import train_ours
from bench.peers.side import REPO, Side
from bench.peers.specforge_peer import train_specforge
from bench.peers.speculators_peer import PYTHON as SPECULATORS_PYTHON
from bench.peers.speculators_peer import train_speculators
from eagle3.config import PipelineConfig
from eagle3.data.chat import ChatTokenizer
from eagle3.evaluate.offline import EvalPrompts, evaluate_offline, load_eval_sets
from eagle3.train.job import TrainJob
from eagle3.train.trainer import Trainer

PEERS = {"speculators": train_speculators, "specforge": train_specforge}


def heldout_of(cfg: PipelineConfig, checkpoint: Path) -> dict[str, Any] | None:
    """Our Trainer's held-out record (loss, per-step accuracy, teacher-forced acceptance length) of a checkpoint's
    weights, loaded as a warm start into a fresh trainer: the same measurement for every side."""
    with tempfile.TemporaryDirectory() as out:
        job = TrainJob(train=cfg.train, run_dir=str(cfg.run_dir), model_dir=str(cfg.model), out_dir=out,
                       device=cfg.train.device, init_from=str(checkpoint))  # fmt: skip
        with Trainer.build(job) as trainer:
            return trainer.measure_heldout()


def side_record(s: Side) -> dict[str, Any]:
    return {"name": s.name, "error": s.error, "tokens_per_s": s.tokens_per_s, "tokens_per_cpu_s": s.tokens_per_cpu_s,
            "first_step_s": s.first_step_s,
            "peak_rss_mb": s.peak_rss_mb, "peak_gpu_mb": s.peak_gpu_mb, "heldout": s.heldout, "command": s.command,
            "notes": s.notes,
            "checkpoint": str(s.checkpoint) if s.checkpoint else None, "steps": s.steps,
            "acceptance": [[n, k, v] for (n, k), v in s.acceptance.items()]}  # fmt: skip


def side_from(record: dict[str, Any]) -> Side:
    s = Side(record["name"], notes=record["notes"], command=record["command"], error=record["error"])
    s.steps, s.peak_rss_mb, s.heldout = record["steps"], record["peak_rss_mb"], record["heldout"]
    s.peak_gpu_mb = record.get("peak_gpu_mb")
    s.checkpoint = Path(record["checkpoint"]) if record["checkpoint"] else None
    s.acceptance = {(n, k): v for n, k, v in record["acceptance"]}
    return s


def measure(side: Side, cfg: PipelineConfig, sets: list[EvalPrompts], work: Path) -> None:
    if side.checkpoint is None:
        return
    side.heldout = heldout_of(cfg, side.checkpoint)
    result = evaluate_offline(cfg.evaluate, Path(cfg.run_dir), Path(cfg.model), side.checkpoint, sets=sets,
                              out=work / "offline.json")  # fmt: skip
    for run in result.runs:
        side.acceptance[(run.set_name or "held-out", run.steps)] = run.acceptance_length


def _f(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def table(sides: list[Side], set_names: list[str], steps: int) -> str:
    gpu = any(s.peak_gpu_mb is not None for s in sides)
    head = ["side", "tok/s", "tok per CPU-s", "first step s", "peak RSS / GPU MB" if gpu else "peak RSS MB",
            f"held-out loss @{steps}", "held-out acc len",
            *[f"{s} k3/k5" for s in set_names]]  # fmt: skip
    rows = [head]
    for s in sides:
        if s.error is not None and s.checkpoint is None:
            rows.append([s.name, "failed: " + s.error[:150]] + [""] * (len(head) - 2))
            continue
        h = s.heldout or {}
        acc = [f"{_f(s.acceptance.get((n, 3)), '.2f')}/{_f(s.acceptance.get((n, 5)), '.2f')}" for n in set_names]
        peak = _f(s.peak_rss_mb, ".0f") + (f" / {_f(s.peak_gpu_mb, '.0f')}" if gpu else "")
        rows.append([s.name, _f(s.tokens_per_s, ".0f"), _f(s.tokens_per_cpu_s, ".0f"), _f(s.first_step_s, ".1f"), peak,
                     _f(h.get("loss"), ".3f"), _f(h.get("acceptance_length"), ".2f"), *acc])  # fmt: skip
    widths = [max(len(r[i]) for r in rows if len(r) > i) for i in range(len(head))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + " |" for r in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, default=REPO / "data" / "bench" / "peers")
    ap.add_argument("--steps", type=int, default=24, help="optimizer steps of every side (demo.yaml's 24)")
    ap.add_argument("--heldout-fraction", type=float, default=0.1, help="train.heldout_fraction (by prompt)")
    ap.add_argument("--peers", nargs="*", default=list(PEERS), choices=list(PEERS))
    ap.add_argument("--set", action="append", default=[], help="more config overrides (key=value)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where every side trains and is measured")
    ap.add_argument(
        "--speculators-python",
        type=Path,
        default=SPECULATORS_PYTHON,
        help="the python of speculators' environment (make speculators-env; a GPU: bench/device/peers.sh)",
    )
    ap.add_argument("--reuse", nargs="*", default=[], help="sides to read from <root>/<side>/side.json")
    args = ap.parse_args()
    root = args.root.resolve()
    steps = args.steps
    overrides = [f"train.max_steps={steps}", f"train.heldout_fraction={args.heldout_fraction}", "train.log_every=1",
                 f"train.checkpoint_every={steps}", f"train.device={args.device}", f"evaluate.device={args.device}",
                 *args.set]  # fmt: skip
    cfg = demo_store(root / "store", overrides)
    sets = load_eval_sets(cfg.evaluate, ChatTokenizer.from_model_dir(Path(cfg.model)))
    sides = []
    peers = {**PEERS, "speculators": functools.partial(train_speculators, python=args.speculators_python)}
    for name, train in [("ours", train_ours), *((p, peers[p]) for p in args.peers)]:
        work = root / name
        work.mkdir(parents=True, exist_ok=True)
        if name in args.reuse:
            sides.append(side_from(json.loads((work / "side.json").read_text())))
            continue
        print(f"[peers_bench] {name}: training", flush=True)
        try:
            side = train(cfg, work)
        except Exception as e:  # a driver's own failure: its row says so, the other sides' rows still print
            side = Side(name, error=f"the bench's driver failed: {type(e).__name__}: {e}")
        print(f"[peers_bench] {name}: measuring {side.checkpoint or '(no checkpoint) ' + str(side.error)}", flush=True)
        measure(side, cfg, sets, work)
        (work / "side.json").write_text(json.dumps(side_record(side), indent=1))
        sides.append(side)
    names = [s.name for s in sets]
    print()
    print(table(sides, names, args.steps))
    for s in sides:
        print(f"\n{s.name}: {s.command}")
        for note in s.notes:
            print(f"  - {note}")
        if s.error:
            print(f"  ! {s.error}")
    t = cfg.train
    print(f"\nshared: {args.steps} steps, batch_tokens {t.batch_tokens}, lr {t.lr} (warm-up {t.warmup_steps}, cosine "
          f"to {t.min_lr_ratio}), TTT {t.ttt_steps} (decay {t.ttt_decay}), draft vocab {t.draft_vocab_size}, "
          f"precision {t.precision}, device {t.device}, held-out fraction {t.heldout_fraction}; "
          f"store {cfg.run_dir}")  # fmt: skip
    (root / "peers.json").write_text(json.dumps([side_record(s) for s in sides], indent=1))
    shutil.rmtree(root / "tmp", ignore_errors=True)


if __name__ == "__main__":
    main()
