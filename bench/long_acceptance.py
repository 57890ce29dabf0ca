"""Acceptance against context length (issue #47): the long multi-turn conversations the target wrote, split by
conversation into training rows and a held-out evaluation set whose prompts are cut at growing context lengths,
then the two drafts' offline evaluations side by side. bench/device/long_context.sh runs it on a GPU.

    python bench/long_acceptance.py split --conversations LONG.jsonl --model DIR --heldout 32 --out DIR
        -> DIR/long-train.jsonl (every conversation but the last --heldout ones: data rows)
           DIR/long-eval.jsonl  (the held-out ones, each cut before one assistant turn per context bucket: an
                                 evaluation set whose rows carry the bucket as `category`)
           DIR/long-split.json  (conversation lengths, rows per bucket)
    python bench/long_acceptance.py report --eval NAME=offline.json [NAME=offline.json ...]
        -> a markdown table: acceptance length per bucket and per set, each draft a row

A held-out conversation is cut before the last assistant turn whose prompt (the turns before it, rendered by the
target's chat template) falls in each bucket, so one conversation gives up to one prompt per bucket; a prompt that
leaves fewer than --room tokens of the target's context is not used.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eagle3.data.chat import ChatTokenizer
from eagle3.data.generate import prompt_ids
from eagle3.target.files import read_target_config

#: Context buckets of the held-out prompts (prompt tokens). The issue's goal compares 4-8K with 1-2K.
BUCKETS = ((0, 1024), (1024, 2048), (2048, 4096), (4096, 8192), (8192, 32768))


def label(low: int, high: int) -> str:
    return f"{low / 1024:g}-{high // 1024}K"


def bucket_of(tokens: int) -> str | None:
    return next((label(lo, hi) for lo, hi in BUCKETS if lo <= tokens < hi), None)


def ends_with_answer(msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation up to its last assistant turn."""
    while msgs and msgs[-1]["role"] != "assistant":
        msgs = msgs[:-1]
    return msgs


def split(args: argparse.Namespace) -> None:
    rows = [json.loads(line) for line in args.conversations.open()]
    if len(rows) <= args.heldout:
        raise SystemExit(f"{args.conversations}: {len(rows)} conversations, --heldout {args.heldout} leaves none")
    chat = ChatTokenizer.from_model_dir(args.model)
    context = int(read_target_config(args.model).get("max_position_embeddings") or 0)
    train, held = rows[: len(rows) - args.heldout], rows[len(rows) - args.heldout :]
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    keep = ("messages", "tools")
    cut, train_lengths = 0, []
    with (out / "long-train.jsonl").open("w") as f:
        for r in train:
            row = {k: r[k] for k in keep if k in r}
            n = len(prompt_ids(chat, row["messages"], row.get("tools")))
            while row["messages"] and context and n > context:
                row["messages"] = ends_with_answer(row["messages"][:-1])  # the target wrote past its context
                n = len(prompt_ids(chat, row["messages"], row.get("tools")))
                cut += 1
            if row["messages"]:
                f.write(json.dumps(row) + "\n")
                train_lengths.append(n)
    lengths, per_bucket = [], dict.fromkeys((label(lo, hi) for lo, hi in BUCKETS), 0)
    with (out / "long-eval.jsonl").open("w") as f:
        for r in held:
            msgs, tools = r["messages"], r.get("tools")
            cuts: dict[str, list[dict[str, Any]]] = {}
            for i, m in enumerate(msgs):
                if m["role"] != "assistant":
                    continue
                n = len(prompt_ids(chat, msgs[:i], tools))
                b = bucket_of(n)
                if b is not None and (not context or n + args.room <= context):
                    cuts[b] = msgs[: i + 1]  # the last assistant turn in the bucket: the longest context there
            lengths.append(len(prompt_ids(chat, msgs, tools)))
            for b, m in cuts.items():
                per_bucket[b] += 1
                f.write(json.dumps({"messages": m, **({"tools": tools} if tools else {}), "category": b}) + "\n")
    stats = {
        "conversations": len(rows), "train": len(train_lengths), "turns_cut_to_context": cut, "heldout": len(held),
        "train_tokens": sum(train_lengths), "train_median_tokens": statistics.median(train_lengths),
        "train_max_tokens": max(train_lengths), "heldout_median_tokens": statistics.median(lengths),
        "assistant_turns_median": statistics.median(sum(m["role"] == "assistant" for m in r["messages"]) for r in rows),
        "eval_rows_per_bucket": per_bucket, "target_context": context,
    }  # fmt: skip
    (out / "long-split.json").write_text(json.dumps(stats, indent=1) + "\n")
    print(json.dumps(stats))


def report(args: argparse.Namespace) -> None:
    """One row per draft: each category's acceptance (rounds pooled) and each set's, k from the files."""
    table: dict[str, dict[str, str]] = {}
    columns: list[str] = []
    for spec in args.eval:
        name, _, path = spec.partition("=")
        doc = json.loads(Path(path).read_text())
        for run in doc.get("runs") or [doc]:
            k = run["steps"]
            for c in run.get("categories") or []:
                col = f"{run['set_name']} {c['category']} k={k}"
                table.setdefault(name, {})[col] = f"{c['acceptance_length']:.3f} ({c['num_prompts']})"
                columns.append(col)
            col = f"{run['set_name']} all k={k}"
            table.setdefault(name, {})[col] = f"{run['acceptance_length']:.3f} ({run['num_prompts']})"
            columns.append(col)
    columns = list(dict.fromkeys(columns))
    print("| draft | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for name, cells in table.items():
        print(f"| {name} | " + " | ".join(cells.get(c, "") for c in columns) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("split")
    s.add_argument("--conversations", type=Path, required=True, help="synthesized records (JSONL, `messages`)")
    s.add_argument("--model", type=Path, required=True, help="the target's directory (chat template, context)")
    s.add_argument("--heldout", type=int, default=32, help="the last N conversations: the evaluation set's")
    s.add_argument("--room", type=int, default=128, help="tokens of context left for the evaluated answer")
    s.add_argument("--out", type=Path, required=True)
    r = sub.add_parser("report")
    r.add_argument("--eval", nargs="+", required=True, metavar="NAME=OFFLINE_JSON")
    args = ap.parse_args()
    split(args) if args.cmd == "split" else report(args)


if __name__ == "__main__":
    main()
