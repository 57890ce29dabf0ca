"""Batched decoding over a static KV cache, our own loop (synthesize and the prompts stage on a GPU).

transformers' `generate` asks the GPU whether every row has finished after each decode step, so the host waits for
each step before queueing the next, and runs its per-step Python (inputs, masks, processors, stopping checks) in
between: on an H200 a 135M target's batch of 1,024 decoded at 3% of what memory bandwidth allows
(docs/performance.md, "In-process generation"). This loop keeps the host ahead of the device: the only reads are
a progress count and "all rows done?" every `report_every` steps; the attention mask is one [B, L] buffer updated
in place; and on CUDA the decode step (the model's forward for one token per row) is captured once per batch as a
CUDA graph and replayed, so a step costs one launch instead of a few hundred. No compiler: a batch of a new shape
costs one more capture (milliseconds), not a compilation. Rows that finished leave the batch once few rows are
left generating (COMPACT_BELOW), so the longest answers do not carry the finished rows to the end.

Same tokens as `generate` (tests/integration/test_generation.py): positions are the left-padded mask's cumulative
sum, logits are taken in float32, and `pick` is what `generate` would do with them (argmax after the row
sampler). Models whose cache is not one full-attention cache per layer (sliding-window layers) are not served by
this loop: `fits` says so and the caller keeps `generate`.

Attention in the decode step is our own (`_grouped_attention`, registered with transformers' AttentionInterface
for the loop's duration): with a padding mask, transformers' SDPA path copies every key/value head once per query
head that shares it (repeat_kv) before calling the kernel, g times the KV cache's bytes each step; with one query
token per row, the g query heads of a group attend as g query positions of their one key/value head instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

ATTENTION = "eagle3_decode"  # the name _grouped_attention is registered under

#: Replay the decode step as a CUDA graph on a GPU (bench/generate_bench.py turns it off to measure what it gives).
CUDA_GRAPH = True
#: Finished rows leave the batch once at most this share of it is still generating (a static batch otherwise runs
#: every row until its longest answer ends: quality run 8's answers averaged 156 of their 256 tokens).
COMPACT_BELOW = 0.5


class Picker(Protocol):
    """The next token of each row from the step's float32 logits [B, V]; `keep(rows)`: the batch now holds only
    these rows (ascending indices into it), for pickers with per-row state (eagle3.data.row_sampler)."""

    def __call__(self, logits: Tensor) -> Tensor: ...

    def keep(self, rows: Tensor) -> None: ...


def fits(model: Any) -> bool:
    """Whether this loop decodes `model`: SDPA attention (the mask below is a boolean one) and no sliding-window
    layers (the mask below covers one full-length cache)."""
    cfg = model.config
    if getattr(cfg, "_attn_implementation", None) != "sdpa":
        return False
    if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True):
        return False
    return not any(t != "full_attention" for t in getattr(cfg, "layer_types", None) or [])


def _grouped_attention(
    module: Any, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None, **kwargs: Any
) -> tuple[Tensor, None]:
    """transformers' attention interface: query [B, nh, q, hd], key/value [B, nkv, L, hd] -> [B, q, nh, hd]. One
    query token (decode): the nh / nkv query heads of key/value head j (heads j*g .. j*g+g-1, as repeat_kv orders
    them) are g query positions against that head; else, and without grouping, transformers' SDPA function."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    b, nh, q, hd = query.shape
    nkv = key.shape[1]
    if q != 1 or nh == nkv:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    out = F.scaled_dot_product_attention(
        query.reshape(b, nkv, nh // nkv, hd), key, value, attn_mask=attention_mask, scale=kwargs.get("scaling")
    )  # [B, nkv, g, hd]
    return out.reshape(b, nh, 1, hd).transpose(1, 2).contiguous(), None


@contextmanager
def _grouped_attention_in(model: Any) -> Iterator[None]:
    """`model` attends through _grouped_attention inside the block, through its own implementation again after."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, _grouped_attention)
    own, model.config._attn_implementation = model.config._attn_implementation, ATTENTION
    try:
        yield
    finally:
        model.config._attn_implementation = own


def _step_fn(model: Any, cache: Any, tok: Tensor, pos: Tensor, mask: Tensor) -> Callable[[], Tensor]:
    def step() -> Tensor:
        out = model(input_ids=tok, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True)
        return out.logits[:, -1]

    return step


def _compact(cache: Any, keep: Tensor) -> None:
    """Keep only the batch rows `keep` of every layer's static cache (the tensors are replaced, so a captured graph
    of the old batch is stale: the caller captures anew)."""
    for layer in cache.layers:  # a model spread over GPUs keeps each layer's cache on that layer's device
        at = keep.to(layer.keys.device)
        layer.keys = layer.keys.index_select(0, at)
        layer.values = layer.values.index_select(0, at)


@torch.inference_mode()
def decode(
    model: Any,
    input_ids: Tensor,
    attention_mask: Tensor,
    max_new_tokens: int,
    stops: Tensor,
    pad: int,
    pick: Picker,
    report: Callable[[int], None],
    report_every: int,
    report_every_s: float,
    cuda_graph: bool | None = None,
) -> Tensor:
    """Generate up to max_new_tokens per row of the left-padded `input_ids` [B, P]; returns [B, T] (T <=
    max_new_tokens: the loop ends once every row has produced a stop token), `pad` after a row's stop. `pick`:
    the step's next tokens (Picker). `report(n)`: the tokens generated since the last report, every
    `report_every` steps (or `report_every_s` seconds) and at the end. `cuda_graph`: replay the decode step as a
    CUDA graph (default: on CUDA). When at most COMPACT_BELOW of the batch's rows are still generating (checked at a
    report, where the host reads anyway), the finished rows leave the batch: its cache, mask and inputs shrink and
    the step is captured anew, so the last long answers do not pay for the rows that ended long ago."""
    from transformers import StaticCache

    b, p = input_ids.shape
    dev = input_ids.device
    length = -(-(p + max_new_tokens) // 8) * 8  # a mask row of 16-byte multiples: SDPA's fused kernels take it as is
    if cuda_graph is None:  # one graph captures one device's work: not for a model spread over several GPUs
        cuda_graph = CUDA_GRAPH and dev.type == "cuda" and len({q.device for q in model.parameters()}) == 1
    cache = StaticCache(config=model.config, max_cache_len=length)
    keys = torch.zeros(b, length, dtype=torch.bool, device=dev)  # the cache slots each row may attend to
    keys[:, :p] = attention_mask.bool()
    pos = (attention_mask.long().cumsum(-1) - 1).masked_fill_(attention_mask == 0, 1)  # as generate sets them

    # prefill: causal over the prompt, padding masked; a padding query attends to itself, so none of its softmax
    # rows is empty (an empty one is NaN, which would reach the cache and, through 0 * NaN, the real rows)
    slot = torch.arange(length, device=dev)
    causal = slot[None, :] <= torch.arange(p, device=dev)[:, None]  # [P, L]
    prefill_mask = (keys[:, None, :] & causal[None]) | (slot[None, :] == torch.arange(p, device=dev)[:, None])[None]
    logits = model(input_ids=input_ids, attention_mask=prefill_mask[:, None], position_ids=pos,
                   past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1]  # fmt: skip
    del prefill_mask

    rows = torch.arange(b, device=dev)  # the original row of each row of the batch as it is now
    tok = torch.empty(b, 1, dtype=torch.long, device=dev)  # the step's inputs, updated in place
    step_pos = pos[:, -1:] + 1
    out = torch.full((b, max_new_tokens), pad, dtype=torch.long, device=dev)
    done = torch.zeros(b, dtype=torch.bool, device=dev)
    counted = torch.zeros((), dtype=torch.long, device=dev)  # tokens since the last report, on the device
    last = time.monotonic()
    steps = max_new_tokens
    side = torch.cuda.Stream(dev) if cuda_graph else None  # eager steps before a capture run on a side stream
    graph: Any = None
    warm = False  # an eager step of this batch's shapes has run: the next one may be captured
    graph_logits = logits
    step = _step_fn(model, cache, tok, step_pos, keys[:, None, None, :])  # the mask: a view of `keys`
    with _grouped_attention_in(model):
        for t in range(max_new_tokens):
            nxt = torch.where(done, pad, pick(logits.float()))
            out[rows, t] = nxt
            counted += (~done).sum()
            done |= torch.isin(nxt, stops)
            if t + 1 == max_new_tokens:
                break
            if (t + 1) % report_every == 0 or time.monotonic() - last >= report_every_s:
                report(int(counted))  # the host reads: every report_every steps
                counted.zero_()
                last = time.monotonic()
                alive = int((~done).sum())
                if not alive:
                    steps = t + 1
                    break
                if alive < len(rows) and alive <= COMPACT_BELOW * len(rows):
                    keep = (~done).nonzero().squeeze(1)
                    _compact(cache, keep)
                    pick.keep(keep)
                    rows, keys, step_pos, nxt, done = rows[keep], keys[keep], step_pos[keep], nxt[keep], done[keep]
                    tok = torch.empty(len(rows), 1, dtype=torch.long, device=dev)
                    step = _step_fn(model, cache, tok, step_pos, keys[:, None, None, :])
                    graph, warm = None, False
            tok.copy_(nxt[:, None])
            keys[:, p + t] = True
            if t:
                step_pos += 1
            if graph is not None:
                graph.replay()
                logits = graph_logits
            elif side is not None and warm:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    graph_logits = step()
                graph.replay()
                logits = graph_logits
            elif side is not None:  # as torch.cuda.graphs advises: warm up on a side stream, not the capture's
                side.wait_stream(torch.cuda.current_stream(dev))
                with torch.cuda.stream(side):
                    logits = step()
                torch.cuda.current_stream(dev).wait_stream(side)
                warm = True
            else:
                logits = step()
    report(int(counted))
    return out[:, :steps]
