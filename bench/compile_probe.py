"""Cold compilation of the draft trainer's compiled pieces, one at a time (issue #33 item 2: where a fresh machine's
first training step spends its minutes). Run each piece in a fresh process with empty caches:

    for p in mask mask-eager mask-blocks flex loss; do
        TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) TRITON_CACHE_DIR=$(mktemp -d) python3 bench/compile_probe.py $p; done

`mask`: FlexAttention's block mask of one packed row (documents, causal) by torch's create_block_mask, compiled,
as the trainer built it until session 14 (cold on an H200 it did not finish in 200 s); `mask-eager`: the same
without compiling; `mask-blocks`: the trainer's now, from each block's first and last document
(eagle3.draft.layers.FlexAttend.block_mask, nothing compiled); `flex`: FlexAttention forward
and backward at the quality draft's shapes (SmolLM2: 9 query heads, 3 key/value heads of 64) over that mask;
`loss`: the fused soft cross-entropy's two chunk functions (eagle3.draft.distill, a 4,096-token chunk, 32,000 draft
tokens).
Prints, per piece, the first call (compilation included) and the second, in seconds.
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def doc_ids(n: int, docs: int, device: str) -> torch.Tensor:
    """A packed row of `docs` documents of random lengths."""
    g = torch.Generator().manual_seed(0)
    cuts = torch.sort(torch.randperm(n - 1, generator=g)[: docs - 1] + 1).values
    doc = torch.zeros(n, dtype=torch.int32)
    doc[cuts] = 1
    return doc.cumsum(0).to(torch.int32).to(device)


def timed(fn) -> float:  # type: ignore[no-untyped-def]
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("piece", choices=["mask", "mask-eager", "mask-blocks", "flex", "loss"])
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--docs", type=int, default=60)
    args = ap.parse_args()
    from torch.nn.attention import flex_attention as fa

    dev = "cuda"
    docs = [doc_ids(args.tokens, args.docs, dev), doc_ids(args.tokens, args.docs + 7, dev)]

    def mask_of(doc: torch.Tensor, compiled: bool) -> object:
        def same_doc_causal(b, h, q_idx, kv_idx):  # type: ignore[no-untyped-def]
            return (doc[q_idx] == doc[kv_idx]) & (kv_idx <= q_idx)

        n = len(doc)
        return fa.create_block_mask(same_doc_causal, None, None, n, n, device=dev, _compile=compiled)

    out: dict[str, object] = {"piece": args.piece, "tokens": args.tokens, "torch": torch.__version__}
    if args.piece == "mask-blocks":
        from eagle3.draft.layers import FlexAttend

        flex = FlexAttend()
        out["first_s"] = timed(lambda: flex.block_mask(docs[0]))
        out["second_s"] = timed(lambda: flex.block_mask(docs[1]))
    elif args.piece in ("mask", "mask-eager"):
        out["first_s"] = timed(lambda: mask_of(docs[0], args.piece == "mask"))
        out["second_s"] = timed(lambda: mask_of(docs[1], args.piece == "mask"))
    elif args.piece == "loss":
        from eagle3.draft import loss

        fwd, bwd = loss._compiled()
        z = torch.randn(4096, 32000, device=dev, dtype=torch.bfloat16)
        probs = torch.softmax(torch.randn(args.tokens, 32000, device=dev), -1)
        src = torch.randint(0, args.tokens, (4096,), device=dev)
        w = torch.rand(4096, device=dev)
        out["first_s"] = timed(lambda: (fwd(z, probs, src, w), bwd(z, probs, src, w)))
        out["second_s"] = timed(lambda: (fwd(z, probs, src, w), bwd(z, probs, src, w)))
    else:
        from eagle3.draft.layers import FlexAttend

        attend = FlexAttend()
        qkv = [torch.randn(args.tokens, h, 64, device=dev, dtype=torch.bfloat16, requires_grad=True) for h in (9, 3, 3)]

        def step(doc: torch.Tensor) -> None:
            o, lse = attend(doc)(*qkv)
            (o.float().sum() + lse.sum()).backward()

        out["first_s"] = timed(lambda: step(docs[0]))
        out["second_s"] = timed(lambda: step(docs[1]))
    print(json.dumps(out), flush=True)
    print(torch._dynamo.utils.compile_times(repr="str"), flush=True)


if __name__ == "__main__":
    main()
