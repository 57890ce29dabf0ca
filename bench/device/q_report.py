"""Tables of a quality run (bench/device/quality.sh) from its records: the ROOT it wrote, or the q.tgz that
bench/device/q_poll.sh brought back, unpacked.

    python bench/device/q_report.py ROOT          # markdown for docs/performance.md
    BASE=fp8 python bench/device/q_report.py ROOT # a run whose base draft is ROOT/fp8 (quality.sh's BASE)
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from eagle3.train.launch import read_heldout_metrics, read_metrics

BASE = os.environ.get("BASE", "bf16")  # the base draft's directory under ROOT (quality.sh's BASE)


def runs_of(root: Path) -> list[dict[str, Any]]:
    """Every (draft, set, k) result of the eval/offline-*.json files: draft = root name [/ train variant]."""
    out = []
    for path in sorted(root.glob("*/run/eval/offline-*.json")):
        store = path.parts[-4]
        tag = path.stem.removeprefix("offline-")  # <set>[-<train variant>][-step<N>]
        step = re.search(r"-step(\d+)$", tag)
        for r in json.loads(path.read_text())["runs"]:
            modelled = r.get("modelled") or {}
            variant = tag.removeprefix(r["set_name"]).removesuffix(step.group(0) if step else "").lstrip("-")
            out.append({
                "draft": f"{store}/{variant}" if variant else store,
                "step": int(step.group(1)) if step else None,
                "set": r["set_name"], "k": r["steps"], "prompts": r["num_prompts"],
                "tau": r["acceptance_length"],
                "rates": [p["rate"] for p in r["positions"]],
                "same": f"{r['identical_to_greedy']}/{r['num_prompts']}",
                "speedup": r["speedup"],
                "categories": r.get("categories", []),
                "method": r.get("method", "eagle3"), "modelled": modelled.get("speedup"),
                "t_ms": [1e3 * modelled[k] for k in ("target_step_s", "verify_s", "draft_s")] if modelled else None,
            })  # fmt: skip
    return out


def fmt_rates(rates: Sequence[float | None]) -> str:
    return ", ".join("-" if r is None else f"{r:.3f}" for r in rates)


def train_acc(metrics: Path, last: int = 5) -> tuple[int, list[float]]:
    """The final step and the mean per-position accuracy of the last `last` logged windows."""
    rows = read_metrics(metrics)
    tail = rows[-last:]
    n = len(tail[0]["step_acc"])
    return rows[-1]["step"], [sum(r["step_acc"][i] for r in tail) / len(tail) for i in range(n)]


def reference(draft: str) -> str:
    """The base a variant is compared with: BASE, or BASE/fracNN for a variant trained on NN% of the data
    (quality.sh's CHOICE_FRACTION names those NAME-fNN)."""
    m = re.search(r"-f(\d+)$", draft)
    return f"{BASE}/frac{m.group(1)}" if m else BASE


def train_cost(root: Path, draft: str) -> str:
    """'steps | tokens/s | train seconds' of a draft: its metrics (median tokens/s of the logged windows) and the
    train stage's wall time in its log (quality.sh: logs/<name>-train.log; the base's data log holds no train)."""
    store, _, variant = draft.partition("/")
    metrics = root / store / "run" / (f"train-{variant}" if variant else "train") / "metrics.jsonl"
    rows = [r for r in read_metrics(metrics) if "tokens_per_s" in r] if metrics.exists() else []
    seconds = "-"
    log = root / "logs" / f"{variant or store}-train.log"
    for line in log.read_text().splitlines() if log.exists() else []:
        if line.startswith('{"stage": "train"'):
            seconds = f"{json.loads(line)['seconds']:.0f}"
    if not rows:
        return f"- | - | {seconds}"
    rates = sorted(r["tokens_per_s"] for r in rows)
    return f"{rows[-1]['step']} | {rates[len(rates) // 2]:,.0f} | {seconds}"


def methods_table(root: Path, finals: list[dict[str, Any]]) -> None:
    """Every draft method on the same store side by side (quality.sh's eagle31, dflash, dspark variants): acceptance,
    the modelled speed-up from the measured forward times (docs/methods.md), and what its training cost."""
    methods = [r for r in finals if r["modelled"] is not None]
    if len({r["method"] for r in methods}) < 2:
        return
    print("\n### Draft methods on one store (offline, greedy, float32 target; modelled = tau x t_step / (t_verify + "
          "t_draft))\n")  # fmt: skip
    print("| draft | method | set | k | acceptance length | modelled speed-up | t_step / t_verify / t_draft (ms) | "
          "per position |")  # fmt: skip
    print("|---|---|---|---:|---:|---:|---|---|")
    for r in sorted(methods, key=lambda r: (r["set"], r["draft"], r["k"])):
        t = " / ".join(f"{x:.2f}" for x in r["t_ms"])
        print(f"| {r['draft']} | {r['method']} | {r['set']} | {r['k']} | {r['tau']:.3f} | {r['modelled']:.2f}x | {t} | "
              f"{fmt_rates(r['rates'])} |")  # fmt: skip
    best = {}
    for r in methods:
        key = (r["set"], r["method"])
        if key not in best or r["modelled"] > best[key]["modelled"]:
            best[key] = r
    print("\n| set | method | best k | modelled speed-up | vs eagle3's best |\n|---|---|---:|---:|---:|")
    for (s, m), r in sorted(best.items()):
        base = best.get((s, "eagle3"))
        ratio = f"{r['modelled'] / base['modelled']:.3f}x" if base else "-"
        print(f"| {s} | {m} | {r['k']} | {r['modelled']:.2f}x | {ratio} |")
    print("\n| draft | method | steps | tokens/s (median) | train seconds |\n|---|---|---:|---:|---:|")
    for d, m in sorted({(r["draft"], r["method"]) for r in methods}):
        print(f"| {d} | {m} | {train_cost(root, d)} |")


def main() -> None:
    root = Path(sys.argv[1])
    runs = runs_of(root)
    finals = [r for r in runs if r["step"] is None]
    print("### Drafts side by side (offline, greedy, float32 target)\n")
    print("| draft | set | k | prompts | acceptance length | per position | identical to greedy | offline speed-up |")
    print("|---|---|---:|---:|---:|---|---:|---:|")
    for r in sorted(finals, key=lambda r: (r["draft"], r["set"], r["k"])):
        print(f"| {r['draft']} | {r['set']} | {r['k']} | {r['prompts']} | {r['tau']:.3f} | {fmt_rates(r['rates'])} | "
              f"{r['same']} | {r['speedup']:.2f}x |")  # fmt: skip
    by = {(r["draft"], r["set"], r["k"]): r for r in finals}
    pairs = [(s, k) for (d, s, k) in by if d == "bf16" and ("fp8", s, k) in by]
    if pairs:
        print("\n### FP8 store vs bf16 store (same data, same seed)\n")
        print("| set | k | bf16 | FP8 | Δ acceptance length | Δ per position | seed 1 (bf16) Δ |")
        print("|---|---:|---:|---:|---:|---|---:|")
        for s, k in sorted(pairs):
            a, b = by[("bf16", s, k)], by[("fp8", s, k)]
            d = [None if x is None or y is None else y - x for x, y in zip(a["rates"], b["rates"], strict=True)]
            seed = by.get(("bf16/seed1", s, k))
            sd = f"{seed['tau'] - a['tau']:+.3f}" if seed else "-"
            print(f"| {s} | {k} | {a['tau']:.3f} | {b['tau']:.3f} | {b['tau'] - a['tau']:+.3f} | "
                  f"{', '.join('-' if x is None else f'{x:+.3f}' for x in d)} | {sd} |")  # fmt: skip
    variants = sorted({d for (d, _, _) in by if d not in (BASE, "bf16", "fp8")})
    if variants:
        print("\n### Training choices (k=3; each against the base draft of the same run and data fraction)\n")
        print("| draft | against | varied | Δ | HumanEval | Δ |")
        print("|---|---|---:|---:|---:|---:|")
        for d in variants:
            ref = reference(d)
            cells = []
            for s in ("varied", "humaneval"):
                got, base = by.get((d, s, 3)), by.get((ref, s, 3))
                tau = f"{got['tau']:.3f}" if got else "-"
                cells += [tau, f"{got['tau'] - base['tau']:+.3f}" if got and base else "-"]
            print(f"| {d} | {ref} | " + " | ".join(cells) + " |")
    methods_table(root, finals)
    curve = sorted((r for r in runs if r["step"] is not None), key=lambda r: r["step"])
    if curve:
        print(f"\n### Epoch curve: the {BASE} draft's checkpoints on the varied set (k=3)\n")
        print("| step | acceptance length | per position |")
        print("|---:|---:|---|")
        for r in curve:
            print(f"| {r['step']} | {r['tau']:.3f} | {fmt_rates(r['rates'])} |")
        final = by.get((BASE, "varied", 3))
        if final:
            print(f"| final | {final['tau']:.3f} | {fmt_rates(final['rates'])} |")
    print("\n### Training accuracy (mean of the last 5 logged windows) vs held-out acceptance per position\n")
    print("| draft | steps | training accuracy by TTT step | held-out slice (train.heldout_fraction): acceptance "
          "length, accuracy by TTT step | varied set, k=3: per-position acceptance |")  # fmt: skip
    print("|---|---:|---|---|---|")
    for metrics in sorted(root.glob("*/run/train*/metrics.jsonl")):
        store, train = metrics.parts[-4], metrics.parts[-2]
        draft = store if train == "train" else f"{store}/{train.removeprefix('train-')}"
        step, acc = train_acc(metrics)
        held = by.get((draft, "varied", 3))
        measured = read_heldout_metrics(metrics)
        last = measured[-1]["heldout"] if measured else None
        sliced = f"{last['acceptance_length']:.3f}; {fmt_rates(last['acc'])}" if last else "-"
        print(f"| {draft} | {step} | {fmt_rates(acc)} | {sliced} | {fmt_rates(held['rates']) if held else '-'} |")
    cats = by.get((BASE, "varied", 3))
    if cats and cats["categories"]:
        print(f"\n### {BASE} draft, varied set by category (k=3)\n")
        print("| category | prompts | acceptance length |")
        print("|---|---:|---:|")
        for c in cats["categories"]:
            print(f"| {c['category']} | {c['num_prompts']} | {c['acceptance_length']:.3f} |")
    # one log per set and GAP_RUNS entry: <base>-gap-<set>[-<tokens>-k<k>].log
    gaps = [f"| {log.stem.split('-gap-', 1)[1]} {line}" for log in sorted((root / "logs").glob("*-gap-*.log"))
            for line in log.read_text().splitlines()
            if line.startswith("| ") and not line.startswith("| set ")]  # fmt: skip
    if gaps:
        print(f"\n### Decoding vs training-time acceptance (bench/acceptance_gap.py, {BASE} draft)\n")
        print("| run | set | prompts | rounds | decode | replayed (rounds differing) | every pos. | first-position "
              "rate: round starts / every pos. |\n|---|---|---:|---:|---:|---:|---:|---|")  # fmt: skip
        print("\n".join(gaps))
    stages = []
    for log in sorted((root / "logs").glob("*.log")):
        for line in log.read_text().splitlines():
            if line.startswith('{"stage"'):
                stages.append((log.stem, json.loads(line)))
    if stages:
        print("\n### Stage times\n")
        print("| process | stage | seconds |")
        print("|---|---|---:|")
        for name, s in stages:
            print(f"| {name} | {s['stage']} | {s['seconds']} |")


if __name__ == "__main__":
    main()
