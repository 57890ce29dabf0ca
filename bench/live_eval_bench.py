"""Live evaluation: an exported draft served by SGLang with EAGLE3 vs the plain server, same prompts.

    .venv/bin/python bench/live_eval_bench.py [--checkpoint C --run-dir R] [--prompts 8] [--max-new-tokens 64]
                                              [--steps 3] [--live on|auto] [--device auto|cpu|cuda] [--port 31320]

Without --checkpoint the draft is an untrained one (random weights, a random draft vocabulary) for the demo
model, exported into a temporary run directory: it shows the serving path and the cost of drafting, and a
speed-up below 1.0 that must be flagged. Prompts: the held-out demo prompts (data/demo_eval_prompts.jsonl)
in the chat template. Runs eagle3/evaluate/live.py (EAGLE3 server first, then the plain one). When the
EAGLE3 server cannot run here (CPU: docs/sglang.md), the plain server is still measured as the baseline.
Prints a markdown table for docs/performance.md. Exit status: 0 ok, 1 flagged (speed-up < 1.0), 3 EAGLE3 not
measured (skipped or unsupported).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eagle3.config import EvaluateConfig, ServerConfig
from eagle3.draft.checkpoint import save_checkpoint
from eagle3.draft.eagle3.model import Eagle3Draft
from eagle3.draft.shape import DraftConfig
from eagle3.evaluate.live import LiveEvalResult, ServerRun, evaluate_live, serve_and_measure
from eagle3.release.export import export_draft
from eagle3.serving.server import server_device
from eagle3.store.run_store import RunInfo, RunStore
from eagle3.target.demo import resolve_model
from eagle3.target.files import model_fingerprint, read_model_facts

REPO = Path(__file__).resolve().parents[1]


def eval_prompts(model_dir: Path, path: Path, n: int) -> list[list[int]]:
    """Each row's turns before its last assistant turn, in the chat template with the generation prompt."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    out = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        messages = [{"role": m.get("role", m.get("from")), "content": m.get("content", m.get("value"))}
                    for m in row.get("messages") or row["conversations"]]  # fmt: skip
        last = max(i for i, m in enumerate(messages) if m["role"] in ("assistant", "gpt"))
        text = tok.apply_chat_template(messages[:last], add_generation_prompt=True, tokenize=False)
        out.append(list(tok(text, add_special_tokens=False).input_ids))
        if len(out) == n:
            break
    return out


def random_draft_run(model_dir: Path, root: Path, draft_vocab: int = 8192) -> tuple[Path, Path]:
    """(checkpoint, run_dir) of an untrained draft: random weights and vocabulary, EAGLE-3's default layers."""
    facts = read_model_facts(model_dir)
    n = facts.num_layers
    aux = [2, n // 2, n - 3]
    RunStore(root / "run").write_run_info(
        RunInfo(model_path=str(model_dir), model_sha256=model_fingerprint(model_dir), tokenizer_sha256="bench",
                engine="bench", engine_version="0", dtype="bfloat16", hidden_size=facts.hidden_size, num_layers=n,
                vocab_size=facts.vocab_size, aux_layers=aux, engine_layer_ids=aux,
                engine_layer_convention="hf_hidden_states", dataset_fingerprint="bench", versions={}, config={})
    )  # fmt: skip
    target = json.loads((model_dir / "config.json").read_text())
    cfg = DraftConfig.from_target(target, num_aux=3, draft_vocab_size=min(draft_vocab, facts.vocab_size))
    torch.manual_seed(0)
    draft = Eagle3Draft(cfg)
    used = torch.randperm(cfg.vocab_size)[: cfg.draft_vocab_size]
    t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    t2d[used] = True
    draft.set_vocab_map(used - torch.arange(cfg.draft_vocab_size), t2d)
    opt = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    ckpt = save_checkpoint(root / "train" / "checkpoints", 0, draft, opt, sched, {"data_position": {}}, keep=1)
    return ckpt, root / "run"


def row(label: str, run: ServerRun | None, note: str = "") -> str:
    if run is None:
        return f"| {label} | | | | {note} |"
    acc = f"{run.accept_length:.2f}" if run.accept_length is not None else ""
    return f"| {label} | {run.tokens_per_s:.1f} | {run.completion_tokens} | {acc} | {note} |"


def table(result: LiveEvalResult, baseline: ServerRun | None, device: str) -> str:
    spec = result.speculative
    lines = [
        f"live evaluation, {device}, {result.num_prompts} prompts x {result.max_new_tokens} new tokens, batch 1, "
        f"greedy; EAGLE3 steps {spec['num_steps']}, topk {spec['eagle_topk']}, draft tokens {spec['num_draft_tokens']}",
        "",
        "| server | tokens/s | tokens | accept length | note |",
        "|---|---|---|---|---|",
        row("plain", result.plain or baseline, "baseline"),
    ]
    if result.status == "ok":
        assert result.speed_up is not None
        note = f"{result.speed_up:.2f}x, {result.mismatched_prompts}/{result.num_prompts} outputs differ"
        lines.append(row("EAGLE3", result.eagle3, ("**FLAGGED** " if result.flag else "") + note))
    else:
        lines.append(row("EAGLE3", None, f"{result.status}: {result.reason}"))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="demo")
    ap.add_argument("--checkpoint", type=Path, help="a trained draft (step dir or checkpoints root)")
    ap.add_argument("--run-dir", type=Path, help="the store it was trained on (with --checkpoint)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--live", choices=("auto", "on"), default="on")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    ap.add_argument("--port", type=int, default=31320)
    ap.add_argument("--max-total-tokens", type=int, default=16384)
    ap.add_argument("--no-baseline", action="store_true", help="skip the plain run when EAGLE3 cannot run")
    args = ap.parse_args()

    model_dir = resolve_model(args.model, REPO / "data")
    work = Path(tempfile.mkdtemp(prefix="live-bench-"))
    if args.checkpoint is not None:
        if args.run_dir is None:
            ap.error("--checkpoint needs --run-dir (its run.json names the aux layers)")
        ckpt, run_dir = args.checkpoint, args.run_dir
    else:
        ckpt, run_dir = random_draft_run(model_dir, work)
    export = export_draft(ckpt, run_dir, model_dir, work / "draft", speculative_tokens=args.steps)
    prompts = eval_prompts(model_dir, REPO / "data" / "demo_eval_prompts.jsonl", args.prompts)

    server = ServerConfig(
        engine="sglang", device=args.device, python=str(REPO / ".venv-sglang" / "bin" / "python"),
        max_total_tokens=args.max_total_tokens,
    )  # fmt: skip
    evaluate = EvaluateConfig(live=args.live, draft_steps=args.steps, max_new_tokens=args.max_new_tokens)
    env: dict[str, Any] = dict(os.environ)

    def report(p: Any) -> None:
        print(p.describe(), file=sys.stderr, flush=True)

    result = evaluate_live(prompts, draft_dir=Path(export.out_dir), model_dir=model_dir, run_dir=work, server=server,
                           evaluate=evaluate, base_env=env, port=args.port, progress=report)  # fmt: skip
    baseline = None
    if result.status != "ok" and not args.no_baseline:
        plain_log = work / "eval" / "server-plain"
        baseline, _ = serve_and_measure(server, model_dir, [], prompts, label="plain", evaluate=evaluate,
                                        log_dir=plain_log, base_env=env, port=args.port)  # fmt: skip
    print(table(result, baseline, server_device(server)))
    print(f"\n{result.summary}\n(results and server logs under {work})")
    sys.exit(0 if result.status == "ok" and not result.flag else 1 if result.flag else 3)


if __name__ == "__main__":
    main()
