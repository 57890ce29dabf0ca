"""In-process generation (synthesize and the prompts stage, transformers engine): tokens per second against the
memory-bandwidth limit, per implementation and batch size.

    python3 bench/generate_bench.py --model DIR [--random-weights] [--batch 256 1024] [--max-new-tokens 256]
                                    [--impl before dynamic static] [--check 64] [--sampled] [--device cuda]

`--random-weights`: the model built from DIR's config.json with seeded random weights (the same shapes and so the
same speed as the trained weights; no answer stops early, so every row generates --max-new-tokens). The prompts are
the demo prompts in the chat template, repeated to fill a batch. Implementations (of
eagle3.data.generate.generate_batch): `before` reads its progress count off the device every decode step, with
the dynamic cache (session 11's code); `dynamic` every 16 steps; `hf-static`: transformers' generate with its
static KV cache, which it compiles on CUDA (the GPU default until session 14, now what models with sliding-window
layers get); `loop-eager`: our decode loop (eagle3.data.decode_loop) over a static cache, eager; `loop`: the same
replaying its decode step as a CUDA graph (the GPU default). `--check N`: of the first N prompts, greedy, how many
rows each implementation answers with exactly `before`'s tokens. tok/s = generated tokens / wall seconds of the
call, after a warm-up call of the same shape (hf-static compiles in it). The limit: bytes read per decode step
(weights + the KV cache at the batch's mean context) over --bandwidth-tbs (H200: 4.8 TB/s).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from eagle3.config import SynthesizeConfig
from eagle3.data import decode_loop, generate
from eagle3.data.chat import ChatTokenizer
from eagle3.data.generate import generate_batch

REPO = Path(__file__).resolve().parents[1]


def load(model_dir: Path, random_weights: bool, device: str, dtype: torch.dtype = torch.bfloat16) -> Any:
    from transformers import AutoConfig, AutoModelForCausalLM

    if not random_weights:
        return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    torch.manual_seed(0)
    cfg = AutoConfig.from_pretrained(model_dir)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()


def prompts_of(chat: ChatTokenizer, n: int) -> list[str]:
    rows = [json.loads(line) for line in (REPO / "data" / "demo_prompts.jsonl").read_text().splitlines()]
    texts = []
    for row in rows:
        users = [m for m in row["messages"] if m["role"] == "user"][:1]
        texts.append(chat.render(users, add_generation_prompt=True))
    return [texts[i % len(texts)] for i in range(n)]


def limit_tok_s(model: Any, batch: int, mean_context: float, bandwidth_tbs: float) -> float:
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    kv_bytes_per_token = c.num_hidden_layers * 2 * c.num_key_value_heads * head_dim * 2  # bf16 K and V
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    step_bytes = weight_bytes + batch * mean_context * kv_bytes_per_token
    return batch / (step_bytes / (bandwidth_tbs * 1e12))


IMPLS = ("before", "dynamic", "hf-static", "loop-eager", "loop")


def run(impl: str, model: Any, chat: ChatTokenizer, prompts: list[str], scfg: SynthesizeConfig, sampled: bool) -> Any:
    """One of IMPLS (the module docstring says which is which)."""
    sampling = [(scfg.temperature if sampled else 0.0, i) for i in range(len(prompts))]
    counted = [0]
    every, fits, graph = generate.PROGRESS_EVERY_STEPS, decode_loop.fits, decode_loop.CUDA_GRAPH
    generate.PROGRESS_EVERY_STEPS = 1 if impl == "before" else every
    decode_loop.fits = (lambda m: False) if impl == "hf-static" else fits  # type: ignore[assignment]
    decode_loop.CUDA_GRAPH = impl == "loop"
    try:
        static = impl in ("hf-static", "loop-eager", "loop")
        return generate_batch(model, chat, prompts, scfg, counted.append, sampling, static_cache=static)
    finally:
        generate.PROGRESS_EVERY_STEPS, decode_loop.fits, decode_loop.CUDA_GRAPH = every, fits, graph


def divergence(f32: Any, chat: ChatTokenizer, prompt: str, a: str, b: str) -> str:
    """Where two greedy answers to `prompt` part: the first differing token, and the float32 model's top-2 logit
    gap there (a near-tie, which bf16 rounding flips, has a gap of a few hundredths) and which side float32 picks."""
    tok = chat.tokenizer
    ids_a, ids_b = (tok(x, add_special_tokens=False)["input_ids"] for x in (a, b))
    i = next((j for j, (x, y) in enumerate(zip(ids_a, ids_b, strict=False)) if x != y), min(len(ids_a), len(ids_b)))
    ctx = tok(prompt, add_special_tokens=False)["input_ids"] + ids_a[:i]
    with torch.inference_mode():
        logits = f32(input_ids=torch.tensor([ctx], device=f32.device)).logits[0, -1]
    top = logits.topk(2)
    gap = float(top.values[0] - top.values[1])
    want = [x[i] if i < len(x) else None for x in (ids_a, ids_b)]
    side = {want[0]: "reference", want[1]: "other"}.get(int(top.indices[0]), "neither")
    return f"token {i}: float32 top-2 gap {gap:.4f}, float32 picks {side}'s"


def profile(
    impl: str, model: Any, chat: ChatTokenizer, prompts: list[str], scfg: SynthesizeConfig, sampled: bool
) -> None:
    """Where one call's device time goes: the top kernels, and the top operators with their input shapes."""
    from torch.profiler import ProfilerActivity, profile

    run(impl, model, chat, prompts, scfg, sampled)  # warm: compiled, captured
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        start = time.perf_counter()
        run(impl, model, chat, prompts, scfg, sampled)
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA" and not e.name.startswith("##")]
    by_name: dict[str, list[float]] = {}
    for e in kernels:
        by_name.setdefault(e.name, []).append(e.device_time / 1e6)
    busy = sum(sum(t) for t in by_name.values())
    print(f"\nprofile {impl}, batch {len(prompts)}, {scfg.max_new_tokens} tokens: {wall:.3f} s wall, device busy "
          f"{busy:.3f} s, {len(kernels)} kernels")  # fmt: skip
    for name, t in sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:20]:
        print(f"  {sum(t) * 1e3:9.1f} ms  x{len(t):6d}  {name[:110]}")
    ops = prof.key_averages(group_by_input_shape=True)
    print(ops.table(sort_by="self_device_time_total", row_limit=15, max_name_column_width=40,
                    max_shapes_column_width=80), flush=True)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--random-weights", action="store_true")
    ap.add_argument("--batch", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--impl", nargs="+", choices=IMPLS, default=list(IMPLS))
    ap.add_argument("--check", type=int, default=64, help="rows compared with before's, greedy (0: none)")
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16", help="the target's weights")
    ap.add_argument("--split", type=int, default=0, help="--check also compares before in batches of N with before")
    ap.add_argument("--detail", action="store_true", help="--check: where each differing row parts (divergence)")
    ap.add_argument("--sampled", action="store_true", help="every row sampled (temperature 0.8), else greedy")
    ap.add_argument("--device", default="cuda")
    ap.add_argument(
        "--profile",
        nargs="*",
        choices=IMPLS,
        default=[],
        help="these implementations once more at the largest batch, 32 tokens, under torch.profiler",
    )
    ap.add_argument("--bandwidth-tbs", type=float, default=4.8, help="H200 HBM3e: 4.8 TB/s")
    args = ap.parse_args()

    model = load(args.model, args.random_weights, args.device, getattr(torch, args.dtype))
    chat = ChatTokenizer.from_model_dir(args.model)
    scfg = SynthesizeConfig(max_new_tokens=args.max_new_tokens, temperature=0.8, batch_size=max(args.batch))
    print("| impl | batch | generated tokens | seconds | tok/s | limit tok/s | of limit |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for batch in args.batch:
        prompts = prompts_of(chat, batch)
        prompt_len = sum(len(chat.tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts) / batch
        for impl in args.impl:
            run(
                impl,
                model,
                chat,
                prompts[: min(batch, 64)],
                scfg.model_copy(update={"max_new_tokens": 16}),
                args.sampled,
            )
            if impl not in ("before", "dynamic"):  # hf-static compiles for the cache's shape: warm up on it
                run(impl, model, chat, prompts, scfg, args.sampled)
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            start = time.perf_counter()
            tokens = sum(t.tokens for t in run(impl, model, chat, prompts, scfg, args.sampled))
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            mean_context = prompt_len + tokens / batch / 2
            limit = limit_tok_s(model, batch, mean_context, args.bandwidth_tbs)
            print(f"| {impl} | {batch} | {tokens:,} | {seconds:.2f} | {tokens / seconds:,.0f} | {limit:,.0f} | "
                  f"{tokens / seconds / limit:.3f} |", flush=True)  # fmt: skip

    for impl in args.profile:
        profile(impl, model, chat, prompts_of(chat, max(args.batch)), scfg.model_copy(update={"max_new_tokens": 32}),
                args.sampled)  # fmt: skip

    if args.check:
        prompts = prompts_of(chat, args.check)
        greedy = scfg.model_copy(update={"temperature": 0.0})
        a = run("before", model, chat, prompts, greedy, False)
        print()
        f32 = copy.deepcopy(model).float() if args.detail else None
        others = {impl: run(impl, model, chat, prompts, greedy, False) for impl in args.impl}
        if args.split:  # the reference against itself, the same prompts in smaller batches
            others[f"before in batches of {args.split}"] = [
                t for i in range(0, len(prompts), args.split)
                for t in run("before", model, chat, prompts[i : i + args.split], greedy, False)
            ]  # fmt: skip
        for name, b in others.items():
            same = sum(x.text == y.text for x, y in zip(a, b, strict=True))
            print(f"{name} vs before, {args.dtype}, greedy, first {args.check} prompts: {same} of {len(a)} rows "
                  "identical", flush=True)  # fmt: skip
            if args.detail:
                for i, (x, y) in enumerate(zip(a, b, strict=True)):
                    if x.text != y.text:
                        print(f"  row {i}: {divergence(f32, chat, prompts[i], x.text, y.text)}", flush=True)


if __name__ == "__main__":
    main()
