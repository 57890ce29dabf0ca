"""The hidden-state capture patch of SGLang (0.5.23), through its own plugin HookRegistry (cpu_spec.py is the
other patch: EAGLE3 serving on CPU, opt-in).

Two hooks on `sglang.srt.managers.tp_worker.TpModelWorker`:

* AFTER `init_attention_backends`: the model is loaded and `set_eagle3_layers_to_capture` has run
  (SGLang calls it there, before CUDA-graph capture), so we read the
  layers SGLang will capture (`model.layers_to_capture`, internal indices = HF hidden_states indices:
  "input of decoder layer i"), log them, check them against EAGLE3_AUX_LAYERS, and write a status
  file `<dump_dir>/.plugin/<pid>.json` that the launcher and `eagle3 doctor` read.
* AROUND `forward_batch_generation`: for EXTEND/MIXED batches, read the per-request layout (rid,
  extend length, prefix length, prompt length) *before* the forward, run it, then slice
  `logits_output.hidden_states` ([rows, K*H], the aux layers concatenated; capture-only mode) and
  `.last_hidden_states` ([rows, H], final post-norm) per captured request, copy the slices off the
  device right away (CUDA-graph outputs may alias graph buffers), and stitch chunked prefill.
  Finished requests go to the background writer (server_patch/writer.py).
  A request whose `.req.json` says store_dtype float8_e4m3 (read once, at its first chunk) is quantized
  on the device before the copy (eagle3.store.sample_format.quantize_fp8): half the bytes cross to the host.

Only attention-TP rank 0 of each attention-DP group writes (under plain TP the states are identical on
every rank). Nothing here raises into SGLang's scheduler: a problem with one request becomes
`<rid>.error.json`, a problem with the batch becomes error files for its captured requests.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

import torch

from eagle3.store import dump_protocol as proto
from eagle3.store.sample_format import FP8_NAME, quantize_fp8
from server_patch.capture import Broken, Complete, Stitcher, plan_batch
from server_patch.writer import Chunk, DumpWriter, Job

log = logging.getLogger("eagle3.server_patch")
log.setLevel(logging.INFO)  # SGLang quiets other loggers; the resolved layers must reach its log
TARGET = "sglang.srt.managers.tp_worker.TpModelWorker"


class _State:
    """Per scheduler process; created by install()."""

    def __init__(self, dump_dir: Path, rid_prefix: str, aux_layers: list[int] | None, depth: int):
        self.dump_dir = dump_dir
        self.rid_prefix = rid_prefix
        self.expected_layers = aux_layers
        self.depth = depth
        self.writer: DumpWriter | None = None  # started on the writing rank only
        self.stitcher = Stitcher()
        self.layers: list[int] = []
        self.writes = False
        self.prompts: dict[str, list[int]] = {}
        self.fp8: dict[str, bool] = {}  # rid -> quantize its states (from its .req.json, read at the first chunk)


_state: _State | None = None


def install(dump_dir: Path, rid_prefix: str, aux_layers: list[int] | None, depth: int) -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    global _state
    _state = _State(dump_dir, rid_prefix, aux_layers, depth)
    HookRegistry.register(f"{TARGET}.init_attention_backends", _after_init, HookType.AFTER)
    HookRegistry.register(f"{TARGET}.forward_batch_generation", _around_forward, HookType.AROUND)


def _ranks() -> dict[str, int]:
    from sglang.srt.runtime_context import get_parallel

    p = get_parallel()
    out = {}
    for name in ("tp_rank", "tp_size", "attn_tp_rank", "attn_dp_rank", "attn_cp_size", "pp_size"):
        try:
            out[name] = int(getattr(p, name))
        except Exception:  # not every name exists in every topology
            continue
    return out


def _layers_to_capture(model: Any) -> list[int] | None:
    for path in ("model", "language_model.model", "model.model"):
        obj = model
        for part in path.split("."):
            obj = getattr(obj, part, None)
        layers = getattr(obj, "layers_to_capture", None)
        if layers:
            return sorted(int(i) for i in layers)
    return None


def _after_init(result: Any, worker: Any, *args: Any, **kwargs: Any) -> None:
    st = _state
    if st is None or getattr(worker, "is_draft_worker", False):
        return None
    ranks = _ranks()
    layers = _layers_to_capture(worker.model_runner.model)
    status: dict[str, Any] = {
        "status": "worker",
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "ranks": ranks,
        "layers_to_capture": layers,
        "expected_layers": st.expected_layers,
        "time": time.time(),
    }
    problem = None
    if layers is None:
        problem = (
            "SGLang captures no aux hidden states: launch with --enable-return-aux-hidden-states "
            "--speculative-algorithm EAGLE3 --return-aux-hidden-state-layer-ids ..."
        )
    elif st.expected_layers is not None and layers != st.expected_layers:
        problem = (
            f"SGLang captures internal layers {layers} (= HF hidden_states indices), but the run expects "
            f"{st.expected_layers}: the layer-id mapping is wrong for this model family"
        )
    elif getattr(getattr(worker, "server_args", None), "enable_two_batch_overlap", False):
        # an attached server's flags are seen only here (a launched one's are refused before the run:
        # eagle3/serving/launch_args.py says why)
        problem = (
            "SGLang runs with --enable-two-batch-overlap, which runs most layers of the MoE families outside the loop "
            "that captures them; relaunch the server without it"
        )
    elif ranks.get("attn_cp_size", 1) > 1 or ranks.get("pp_size", 1) > 1:
        problem = f"unsupported parallel layout {ranks} (attention context parallel / pipeline parallel)"
    st.writes = problem is None and ranks.get("attn_tp_rank", 0) == 0
    st.layers = list(layers or [])
    status.update(writes=st.writes, problem=problem)
    if problem:
        log.error("eagle3 hook: %s", problem)
    else:
        log.info(
            "eagle3 hook: capturing HF hidden_states %s (SGLang layers_to_capture), last = final norm; "
            "rid prefix %r, dump dir %s, ranks %s, writer %s",
            layers,
            st.rid_prefix,
            st.dump_dir,
            ranks,
            "on" if st.writes else "off (not attention-TP rank 0)",
        )
    if st.writes and st.writer is None:
        st.writer = DumpWriter(st.dump_dir, st.depth)
    try:
        proto.write_status(st.dump_dir, f"{socket.gethostname()}-{os.getpid()}", status)
    except OSError:
        log.exception("eagle3 hook: cannot write its status file under %s", st.dump_dir)
    return None


def _off_device(t: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """A CPU copy that owns its storage; async (pinned) for CUDA tensors."""
    if t.is_cuda:
        out = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        out.copy_(t, non_blocking=True)
        return out, True
    return t.clone(), False


def _around_forward(original: Any, worker: Any, batch: Any = None, *args: Any, **kwargs: Any) -> Any:
    st = _state
    mode = getattr(getattr(batch, "forward_mode", None), "name", None)
    if st is None or not st.writes or batch is None or mode not in ("EXTEND", "MIXED"):
        return original(worker, batch, *args, **kwargs)
    # Read the layout before the forward: the scheduler may reuse these lists afterwards.
    reqs = list(batch.reqs)
    rids = [str(r.rid) for r in reqs]
    if not any(r.startswith(st.rid_prefix) for r in rids):
        return original(worker, batch, *args, **kwargs)
    plan = plan_batch(
        rids,
        list(batch.extend_lens),
        list(batch.prefix_lens),
        [len(r.origin_input_ids) for r in reqs],
        st.rid_prefix,
    )
    for r in reqs:
        if r.rid in (s.rid for s in plan.segments):
            st.prompts[r.rid] = list(r.origin_input_ids)
    for seg in plan.segments:
        if seg.position == 0 or seg.rid not in st.fp8:
            st.fp8[seg.rid] = _wants_fp8(st.dump_dir, seg.rid)

    result = original(worker, batch, *args, **kwargs)
    try:
        _capture(st, plan, result)
    except Exception as e:  # never break serving; the affected requests get error files
        log.exception("eagle3 hook: capture failed")
        for seg in plan.segments:
            _fail(st, seg.rid, f"capture failed: {type(e).__name__}: {e}")
    return result


def _wants_fp8(dump_dir: Path, rid: str) -> bool:
    """Whether the client asked for FP8 states (its .req.json; one small read per request). A missing or
    malformed request file means bf16 here; the writer reports the problem itself."""
    try:
        return proto.read_request(dump_dir, rid).store_dtype == FP8_NAME
    except (OSError, ValueError, KeyError):
        return False


def _fail(st: _State, rid: str, reason: str) -> None:
    st.stitcher.drop(rid)
    st.prompts.pop(rid, None)
    st.fp8.pop(rid, None)
    assert st.writer is not None
    st.writer.error(rid, reason)


def _capture(st: _State, plan: Any, result: Any) -> None:
    st.stitcher.tick()
    for rid, reason in plan.errors.items():
        _fail(st, rid, reason)
    if not plan.segments:
        return
    out = getattr(result, "logits_output", None)
    aux = getattr(out, "hidden_states", None)
    last = getattr(out, "last_hidden_states", None)
    if aux is None or last is None:
        for seg in plan.segments:
            _fail(st, seg.rid, "the forward returned no aux/last hidden states (capture-only mode off?)")
        return
    if (
        getattr(out, "hidden_states_token_indices", None) is not None
        or aux.shape[0] != plan.total_rows
        or (last.shape[0] != plan.total_rows)
    ):
        for seg in plan.segments:
            _fail(
                st,
                seg.rid,
                f"rows do not add up: the batch lays out {plan.total_rows} rows, the forward returned "
                f"aux {tuple(aux.shape)} and last {tuple(last.shape)}",
            )
        return
    k = len(st.layers)
    for seg in plan.segments:
        rows = slice(seg.row_start, seg.row_start + seg.num_rows)
        aux_rows, last_rows = aux[rows], last[rows]  # [n, K*H], [n, H]
        scales: list[torch.Tensor] = []
        if st.fp8.get(seg.rid, False):  # quantize where the states are, before the copy
            n, h = last_rows.shape
            qa, sa = quantize_fp8(aux_rows.view(n, k, h))  # [n, K, H] fp8, [n, K]
            ql, sl = quantize_fp8(last_rows)  # [n, H] fp8, [n]
            aux_rows, last_rows, scales = qa.view(n, k * h), ql, [sa, sl]
        a, on_gpu = _off_device(aux_rows)  # [n, K*H]
        b, _ = _off_device(last_rows)  # [n, H]
        sc = [_off_device(x)[0] for x in scales]
        ready = None
        if on_gpu:
            ready = torch.cuda.Event()
            ready.record()
        chunk = Chunk(a, b, ready, *sc) if sc else Chunk(a, b, ready)
        for outcome in st.stitcher.add(seg, chunk):
            if isinstance(outcome, Broken):
                _fail(st, outcome.rid, outcome.reason)
            elif isinstance(outcome, Complete):
                st.fp8.pop(outcome.rid, None)
                prompt = st.prompts.pop(outcome.rid, [])
                assert st.writer is not None
                st.writer.submit(Job(outcome.rid, prompt, outcome.chunks, st.layers))
