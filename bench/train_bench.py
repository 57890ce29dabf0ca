"""Trainer throughput on a Llama-3.1-8B-shaped EAGLE-3 draft, over a synthetic store in the exact store format.

    python bench/train_bench.py make --root R [--samples 128] [--store-dtype float8_e4m3]  # store + target, once
    torchrun --nproc_per_node N bench/train_bench.py run --root R [--steps 20]  # on 1..N GPUs
    torchrun --nproc_per_node N bench/train_bench.py run --root R --parallel fsdp  # FSDP2 instead of DDP
    # another draft method (docs/methods.md) on a 5-layer store of the demo target's shape:
    python bench/train_bench.py make --root R --shape smollm2 --aux-layers 2,8,15,22,27
    torchrun --nproc_per_node 1 bench/train_bench.py run --root R --shape smollm2 --method dflash
    python bench/train_bench.py check                                          # flex vs dense attention

`run` times, in one process per GPU (one compile): (1) `memory`: the same few batches already on the GPU,
the step alone; (2) `disk`: the trainer's own loader (memory-mapped sample files, background threads, side
stream copy), evicting the store from the page cache after every step so that reads come from the device.
It prints one JSON line per mode (rank 0) with
tokens/s per GPU, MFU, the data loader's share of step time, and peak memory.

MFU = model FLOPs per token x tokens/s / peak, peak = 989 TFLOP/s (H200 dense bf16 datasheet). Model FLOPs
per token (documents of T tokens, k TTT steps, K aux layers, H hidden, I MLP, nh/nkv heads of hd, Vd draft
and V target vocabulary), forward x 3 for forward + backward, no recomputation counted:
    3 * [2*K*H*H  +  k * (2*(2H*(nh+2*nkv)*hd + nh*hd*H + 3*H*I + H*Vd) + 4*nh*hd*(T+1)/2)]  +  2*H*V
the last term being the frozen target lm_head (forward only) that gives the target distribution.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from eagle3.config import TrainConfig
from eagle3.draft.synthetic import SyntheticSpec, write_run
from eagle3.train.job import TrainJob
from eagle3.train.trainer import Trainer

PEAK_BF16 = 989e12
LLAMA_8B = {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_heads": 32,
    "num_kv_heads": 8,
    "head_dim": 128,
    "vocab_size": 128256,
    "draft_vocab_size": 32000,
    "num_layers": 32,
    "aux_layers": (2, 16, 29),
    "rope": {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
}


def flops_per_token(
    h: int, i: int, nh: int, nkv: int, hd: int, k_aux: int, vd: int, v: int, steps: int, t: int
) -> float:
    per_step = 2 * (2 * h * (nh + 2 * nkv) * hd + nh * hd * h + 3 * h * i + h * vd) + 4 * nh * hd * (t + 1) / 2
    return 3 * (2 * k_aux * h * h + steps * per_step) + 2 * h * v


#: The demo target's draft (SmolLM2-135M-Instruct): the quality runs' shape (docs/performance.md).
SMOLLM2 = {
    **LLAMA_8B,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_heads": 9,
    "num_kv_heads": 3,
    "head_dim": 64,
    "vocab_size": 49152,
    "num_layers": 30,
    "aux_layers": (2, 15, 27),
    "rope": {"rope_type": "default", "rope_theta": 100000.0},
}


def shape(args: argparse.Namespace) -> dict[str, Any]:
    """The Llama-3.1-8B draft (--shape smollm2: the demo target's), or (--tiny) a CPU-sized stand-in that
    exercises the same code."""
    if not args.tiny:
        return SMOLLM2 if args.shape == "smollm2" else LLAMA_8B
    return {
        **LLAMA_8B,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_heads": 4,
        "num_kv_heads": 2,
        "head_dim": 16,
        "vocab_size": 512,
        "draft_vocab_size": 128,
    }


def make(args: argparse.Namespace) -> None:
    layers = {"aux_layers": tuple(int(x) for x in args.aux_layers.split(","))} if args.aux_layers else {}
    spec = SyntheticSpec(
        **{**shape(args), **layers}, lengths=(args.seq,) * args.samples, learnable=False, store_dtype=args.store_dtype
    )
    t0 = time.perf_counter()
    write_run(Path(args.root) / "store", Path(args.root) / "target", spec, device=args.device, threads=16)
    print(json.dumps({"made": args.root, "samples": args.samples, "seq": args.seq, "s": time.perf_counter() - t0}))


def evict(paths: list[Path]) -> None:
    """Drop the store's files from the page cache, so `disk` reads them from the device."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def timed_steps(trainer: Trainer, batches: Any, steps: int, warmup: int, evict_each: bool) -> dict[str, Any]:
    """Median step time after `warmup` steps; `evict_each`: drop the store from the page cache after every
    step, so every read in the timed steps comes from the device, not from memory."""
    times, tokens, losses = [], [], []
    files = [s.path for s in trainer.stream.samples]
    wait0 = trainer.stream.wait_s
    t_start = 0.0
    for n, batch in enumerate(batches):
        if n == warmup:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            wait0, t_start = trainer.stream.wait_s, time.perf_counter()
        t0 = time.perf_counter()
        out = trainer.train_step(batch)  # ends in a device sync (loss and grad norm to the host)
        times.append(time.perf_counter() - t0)
        tokens.append(out.tokens)
        losses.append(round(out.loss, 4))
        if evict_each:
            evict(files)
        if trainer.rank == 0 and n < warmup:
            print(json.dumps({"warmup_step": n, "s": times[-1]}), flush=True)
        if n + 1 == warmup + steps:
            break
    wall = time.perf_counter() - t_start
    return {
        "step_s_median": statistics.median(times[warmup:]),
        "wall_s": wall,
        "steps": steps,
        "tokens_per_step": statistics.mean(tokens[warmup:]),
        "tokens_per_s": sum(tokens[warmup:]) / wall,
        "data_wait_s": trainer.stream.wait_s - wait0,
        "first_step_s": times[0],
        "losses": losses,  # memory mode cycles 4 cached batches: ddp and fsdp runs must give the same sequence
    }


#: Kernel classes of a profile, by name (first match wins): where a step's GPU time goes.
KERNEL_CLASSES = (
    ("attention (flex)", ("flex_attention", "triton_tem_fused")),
    ("matmul", ("gemm", "sm90_xmma", "cutlass", "nvjet", "ampere_", "matmul", "mm_")),
    ("fused elementwise (inductor)", ("triton_",)),
    ("optimizer", ("adam", "multi_tensor", "foreach")),
    ("reduction / softmax", ("reduce", "softmax", "logsumexp", "norm")),
    ("copy / cast", ("copy", "cast", "fill", "memset", "memcpy")),
)


def kernel_class(name: str) -> str:
    low = name.lower()
    return next((c for c, keys in KERNEL_CLASSES if any(k in low for k in keys)), "other")


def profile_steps(trainer: Trainer, batches: Any, steps: int, out: Path | None) -> dict[str, Any]:
    """`steps` more steps under torch.profiler: GPU time per kernel class and the top kernels, the GPU busy
    share of the wall time (the rest: the host launching or waiting). Prints a table; the raw rows go to `out`."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        t0 = time.perf_counter()
        for _, batch in zip(range(steps), batches, strict=False):
            trainer.train_step(batch)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA" and not e.name.startswith("##")]  # no ranges
    total = sum(e.device_time for e in kernels) / 1e6  # us -> s
    by_class: dict[str, float] = {}
    by_name: dict[str, list[float]] = {}
    for e in kernels:
        c = kernel_class(e.name)
        by_class[c] = by_class.get(c, 0.0) + e.device_time / 1e6
        by_name.setdefault(e.name, []).append(e.device_time / 1e6)
    top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:25]
    result = {
        "steps": steps,
        "wall_s_per_step": wall / steps,
        "gpu_busy_s_per_step": total / steps,
        "kernels_per_step": len(kernels) / steps,
        "by_class_s_per_step": {k: v / steps for k, v in sorted(by_class.items(), key=lambda kv: -kv[1])},
        "top_kernels": [
            {"name": n[:120], "calls_per_step": len(t) / steps, "s_per_step": sum(t) / steps, "class": kernel_class(n)}
            for n, t in top
        ],
    }
    print(f"\nprofile: {wall / steps:.3f} s/step wall, GPU busy {total / steps:.3f} s, "
          f"{len(kernels) / steps:.0f} kernels/step", flush=True)  # fmt: skip
    for c, v in result["by_class_s_per_step"].items():
        print(f"  {c:32s} {v * 1e3:8.1f} ms  {100 * v * steps / total:5.1f}%", flush=True)
    for k in result["top_kernels"]:
        print(f"  {k['s_per_step'] * 1e3:8.2f} ms x{k['calls_per_step']:5.0f}  {k['class']:24s} {k['name'][:90]}")
    ops = prof.key_averages(group_by_input_shape=True).table(
        sort_by="self_device_time_total", row_limit=20, max_name_column_width=40, max_shapes_column_width=70
    )
    print(ops, flush=True)
    if out is not None:
        out.write_text(json.dumps(result, indent=2))
        out.with_suffix(".ops.txt").write_text(ops)
    return result


def run(args: argparse.Namespace) -> None:
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(local)
    if world > 1:
        dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    root = Path(args.root)
    cfg = TrainConfig.model_validate(
        {
            "batch_tokens": args.batch_tokens,
            "ttt_steps": args.ttt_steps,
            "draft_vocab_size": shape(args)["draft_vocab_size"],
            "max_steps": 10_000,
            "log_every": 10_000,
            "checkpoint_every": 10_000,
            "warmup_steps": 10,
            "compile": args.compile,
            "target_chunk_tokens": args.chunk,
            "loader_threads": args.threads,
            "prefetch_batches": args.prefetch,
            "parallel": args.parallel,
            "method": args.method,
        }
    )
    job = TrainJob(
        train=cfg,
        run_dir=str(root / "store"),
        model_dir=str(root / "target"),
        out_dir=str(root / f"out-{world}"),
        device=args.device,
    )
    if args.eager_loss:  # the A/B of the fused soft cross-entropy: its chunk functions stay eager under --compile
        from eagle3.draft import loss

        loss._compiled = lambda: (loss._ce_chunk, loss._ce_chunk_grad)  # type: ignore[method-assign]
    t0 = time.perf_counter()
    trainer = Trainer.build(job, rank=rank, world=world, local_rank=local)
    if rank == 0:
        print(json.dumps({"built_s": time.perf_counter() - t0}), flush=True)
    d = trainer.model.cfg
    # the FLOPs formula (the module docstring) is EAGLE-3's TTT chain: no MFU for a block drafter
    fpt = (
        None
        if not args.method.startswith("eagle3")
        else flops_per_token(
            d.hidden_size,
            d.intermediate_size,
            d.num_heads,
            d.num_kv_heads,
            d.head_dim,
            d.num_aux,
            d.draft_vocab_size,
            d.vocab_size,
            args.ttt_steps,
            args.seq,
        )
    )
    results = {}
    try:
        for mode in args.modes.split(","):
            if mode == "memory":
                it = trainer.stream.iterate(trainer.pos)
                cached = [next(it)[1] for _ in range(4)]
                batches: Any = (cached[n % 4] for n in range(10**9))
            else:
                if rank == 0:
                    evict([s.path for s in trainer.stream.samples])
                if world > 1:
                    dist.barrier()
                batches = (b for _, b in trainer.stream.iterate(trainer.pos))
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            r = timed_steps(trainer, batches, args.steps, args.warmup, evict_each=mode == "disk")
            r.update(
                mode=mode,
                gpus=world,
                batch_tokens=args.batch_tokens,
                compile=args.compile,
                parallel=args.parallel if world > 1 else "none",
                flops_per_token=fpt,
                mfu=None if fpt is None else fpt * r["tokens_per_s"] / PEAK_BF16,
                peak_mem_gib=torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0,
                data_wait_frac=r["data_wait_s"] / r["wall_s"],
            )
            if world > 1:
                t = torch.tensor([r["tokens_per_s"]], device=trainer.device)
                dist.all_reduce(t)
                r["tokens_per_s_all_gpus"] = float(t)
            results[mode] = r
            if rank == 0:
                print(json.dumps(r), flush=True)
                if args.compile and len(results) == 1:  # where the first step's compilation went
                    print(torch._dynamo.utils.compile_times(repr="str"), flush=True)
            if args.profile and mode == "memory" and rank == 0 and cuda:
                raw = Path(args.out + ".profile") if args.out else None
                r["profile"] = profile_steps(trainer, batches, args.profile, raw)
    finally:
        trainer.close()
        if dist.is_initialized():
            dist.destroy_process_group()
    if rank == 0 and args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))


def check(args: argparse.Namespace) -> None:
    """FlexAttention (compiled, with logsumexp gradients) against the dense reference, forward and backward."""
    from eagle3.draft.eagle3.model import ttt_attention
    from eagle3.draft.layers import FlexAttend, dense_attend

    torch.manual_seed(0)
    n, nh, nkv, hd = 1024, 8, 2, 64
    doc = torch.repeat_interleave(torch.arange(4, device="cuda"), torch.tensor([300, 200, 400, 124], device="cuda"))
    flex = FlexAttend()
    for steps in (1, 3):
        q = torch.randn(n, nh, hd, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        cache = [
            (
                torch.randn(n, nkv, hd, device="cuda", dtype=torch.bfloat16, requires_grad=True),
                torch.randn(n, nkv, hd, device="cuda", dtype=torch.bfloat16, requires_grad=True),
            )
            for _ in range(steps)
        ]
        grads = []
        for attend in (flex(doc), dense_attend(doc)):
            out = ttt_attention(q, cache, attend)
            g = torch.autograd.grad((out.float() ** 2).sum(), [q, *[t for kv in cache for t in kv]])
            grads.append((out.detach().float(), [x.float() for x in g]))
        (o1, g1), (o2, g2) = grads
        rel = [float((a - b).norm() / b.norm()) for a, b in zip([o1, *g1], [o2, *g2], strict=True)]
        print(json.dumps({"check": "flex_vs_dense", "steps": steps, "max_rel_err": max(rel), "rel": rel}), flush=True)
        assert max(rel) < 2e-2, rel
    check_blocks()


def check_blocks(device: str = "cuda", lengths: tuple[int, ...] = (700, 1300, 400, 1900, 500)) -> None:
    """The block drafters' FlexAttention (compiled, the CUDA training path) against their dense mask: forward and
    the weights' gradients of DFlash and DSpark drafts over one packed row of several documents, bf16 autocast."""
    from eagle3.draft.dflash.loss import block_mask, flex_block_mask
    from eagle3.draft.methods import method_named
    from eagle3.draft.shape import DraftConfig

    torch.manual_seed(0)
    target = {"hidden_size": 576, "intermediate_size": 1536, "num_attention_heads": 9, "num_key_value_heads": 3,
              "head_dim": 64, "vocab_size": 4096, "num_hidden_layers": 30, "rms_norm_eps": 1e-5,
              "max_position_embeddings": 8192, "model_type": "llama"}  # fmt: skip
    n = sum(lengths)
    doc = torch.cat([torch.full((m,), i, dtype=torch.int32) for i, m in enumerate(lengths)]).to(device)
    positions = torch.cat([torch.arange(m) for m in lengths]).to(device)
    for method in ("dflash", "dspark"):
        cfg = DraftConfig.from_target(target, num_aux=5, draft_vocab_size=1024)
        train = TrainConfig.model_validate({"method": method})
        model = method_named(method).build(cfg, torch.randn(4096, 576), lm_head=torch.randn(4096, 576), train=train)
        model = model.to(device)
        aux = torch.randn(n, 5, 576, device=device)
        ids = torch.randint(4096, (n,), device=device)
        g = torch.Generator().manual_seed(0)
        anchors = torch.randperm(n, generator=g)[: 2 * n // 16].sort().values.to(device)
        results = []
        for mask in (flex_block_mask(doc, anchors, model.queries), block_mask(doc, anchors, model.queries)):
            model.zero_grad()
            with torch.autocast(device, dtype=torch.bfloat16):
                out = model(aux, positions, ids[anchors], positions[anchors], mask)
            (out.float() ** 2).mean().backward()
            grads = [p.grad.float().clone() for p in model.parameters() if p.grad is not None]
            results.append((out.detach().float(), grads))
        (o1, g1), (o2, g2) = results
        rel = [float((a - b).norm() / b.norm()) for a, b in zip([o1, *g1], [o2, *g2], strict=True)]
        print(json.dumps({"check": f"{method}_flex_vs_dense", "max_rel_err": max(rel)}), flush=True)
        assert max(rel) < 2e-2, rel


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cmd", choices=["make", "run", "check"])
    ap.add_argument("--root", default="/tmp/eagle3-bench")
    ap.add_argument("--samples", type=int, default=128)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch-tokens", type=int, default=16384)
    ap.add_argument("--ttt-steps", type=int, default=7)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--chunk", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--prefetch", type=int, default=4)
    ap.add_argument("--modes", default="memory,disk")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--parallel", choices=["ddp", "fsdp"], default="ddp", help="train.parallel (with N > 1)")
    ap.add_argument("--shape", choices=["llama8b", "smollm2"], default="llama8b", help="the draft's target")
    ap.add_argument("--tiny", action="store_true", help="CPU-sized shapes, to try the script without a GPU")
    ap.add_argument("--aux-layers", default="", help="make: the store's layers, e.g. 2,8,15,22,27")
    ap.add_argument("--method", default="eagle3", help="run: train.method (a block drafter needs a 5-layer store)")
    ap.add_argument("--out", default="")
    ap.add_argument("--profile", type=int, default=0, help="memory mode: profile this many more steps (1 GPU)")
    ap.add_argument("--eager-loss", action="store_true", help="with --compile: keep the soft cross-entropy eager")
    ap.add_argument("--store-dtype", default="bfloat16", choices=["bfloat16", "float8_e4m3"], help="make: the store's")
    args = ap.parse_args()
    {"make": make, "run": run, "check": check}[args.cmd](args)


if __name__ == "__main__":
    main()
