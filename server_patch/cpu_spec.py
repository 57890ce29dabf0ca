"""Opt-in CPU fallback that lets SGLang 0.5.23 serve `--speculative-algorithm EAGLE3` with `--device cpu`.

Installed by `load_plugin()` only when EAGLE3_CPU_SPEC=1 and the server runs on CPU; without the switch
nothing here is imported. What stops EAGLE3 on a CPU without AMX (docs/sglang.md), and what this supplies:

1. The PyPI `sgl_kernel` registers none of the `*_cpu` ops EAGLE calls on CPU (they come from SGLang's CPU
   kernel build). `register_ops()` defines the ones the chain path calls under `torch.ops.sgl_kernel` with
   `torch.library`, in plain torch/Python, ported from the Triton kernels in sglang/kernels/ops/
   (kvcache/cache_move.py, speculative/{cache_locs,eagle,spec_tree}.py, srt/mem_cache/allocation.py).
   An op that is already registered (a real CPU kernel build) is left alone.
2. `DraftBackendFactory` (speculative/draft_utils.py) has no draft attention backends for `torch_native`,
   the only attention backend that runs here. A hook adds them: draft extend = a plain
   `TorchNativeAttnBackend`; draft decode = one `TorchNativeAttnBackend` per step whose single query (at
   seq_len + step) sees the prefix plus step + 1 draft tokens, as IntelAMXMultiStepDraftBackend does.
3. `TorchNativeAttnBackend.forward_extend` reads extend_prefix_lens / extend_seq_lens, which a TARGET_VERIFY
   batch does not carry. A hook answers TARGET_VERIFY itself: with --speculative-eagle-topk 1 the draft
   tokens form a chain, so verify is a causal extend of draft_token_num tokens after seq_lens (no tree mask).
4. `spec_utils._select_top_k_tokens_later` is `torch.compile`d; on CPU its first call spends ~70 s in
   inductor. A REPLACE hook runs the same function eagerly.

Scope (what is tested, tests/integration/test_live_sglang_cpu.py): chain drafting (topk 1), greedy, one
request at a time, a Llama target (SmolLM2-135M). Tree drafting (topk > 1) is refused with a clear error:
its verify needs the tree mask, which this fallback does not implement. Speed is not the point: on this CPU
the target is too small for speculation to pay; this exists so the exported draft can be served and checked
end to end without a GPU.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
from collections.abc import Callable
from typing import Any

import torch

from eagle3.store.dump_protocol import ENV_CPU_SPEC as ENV_SWITCH
from eagle3.store.dump_protocol import SUPPORTED_SGLANG

log = logging.getLogger("eagle3.server_patch.cpu_spec")

_LIBRARY: Any = None  # the torch.library fragment; kept alive for the process (dropping it unregisters the ops)
_INSTALLED = False


class UnsupportedCpuSpec(RuntimeError):
    pass


def enabled(env: dict[str, str] | None = None) -> bool:
    return (os.environ if env is None else env).get(ENV_SWITCH) == "1"


# sgl_kernel ops -------------------------------------------------------------------------------------------------------
def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor, src_loc: torch.Tensor
) -> None:
    """For every KV buffer (base address data_ptrs[i], row stride strides[i] bytes): row tgt <- row src.
    All sources are read before any target is written (the Triton kernel is safe for in-place copies)."""
    tgt, src = tgt_loc.to(torch.int64), src_loc.to(torch.int64)
    if tgt.numel() == 0:
        return
    rows = int(torch.maximum(tgt.max(), src.max())) + 1
    for ptr, stride in zip(data_ptrs.tolist(), strides.tolist(), strict=True):
        raw = (ctypes.c_uint8 * (rows * int(stride))).from_address(int(ptr))
        buf = torch.frombuffer(raw, dtype=torch.uint8).view(rows, int(stride))
        buf[tgt] = buf[src].clone()


def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
    topk: int,
    num_steps: int,
) -> None:
    """out_cache_loc[b * n : (b + 1) * n] = req_to_token[req b, seq_len b : seq_len b + n], n = topk * num_steps."""
    n = topk * num_steps
    for b, (req, start) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist(), strict=True)):
        out_cache_loc[b * n : (b + 1) * n] = req_to_token[req, start : start + n].to(out_cache_loc.dtype)


def assign_extend_cache_locs_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """out_cache_loc = concat over b of req_to_token[req b, start b : end b]."""
    pos = 0
    for req, s, e in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist(), strict=True):
        out_cache_loc[pos : pos + e - s] = req_to_token[req, s:e].to(out_cache_loc.dtype)
        pos += e - s


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """The inverse: req_to_token[req b, start b : end b] = the next end b - start b entries of out_cache_loc."""
    pos = 0
    for req, s, e in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist(), strict=True):
        req_to_token[req, s:e] = out_cache_loc[pos : pos + e - s].to(req_to_token.dtype)
        pos += e - s


def fill_bonus_tokens_cpu(
    accept_tokens: torch.Tensor, accept_lens: torch.Tensor, bonus_tokens: torch.Tensor, accept_stride: int
) -> None:
    """bonus_tokens[b] = accept_tokens.flat[accept_stride * b + accept_lens[b] - 1] (the last accepted token)."""
    idx = torch.arange(accept_lens.numel(), dtype=torch.int64) * accept_stride + accept_lens.to(torch.int64) - 1
    bonus_tokens.copy_(accept_tokens.reshape(-1)[idx].to(bonus_tokens.dtype))


def verify_tree_greedy_cpu(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """Greedy tree verification, verify_tree_greedy_kernel_triton (speculative/spec_tree.py) line by line: walk
    down from the root, at each level accept the child (or sibling) equal to the target's prediction there."""
    num_spec = accept_index.shape[1]
    cand, ridx = candidates.tolist(), retrive_index.tolist()
    nxt, sib = retrive_next_token.tolist(), retrive_next_sibling.tolist()
    target = target_predict.reshape(-1).tolist()  # indexed by global node id, as the kernel does
    for bx in range(candidates.shape[0]):
        last = ridx[bx][0]
        accept_index[bx, 0] = last
        accepted, cur = 0, 0
        for _ in range(1, num_spec):
            cur = nxt[bx][cur]
            want = target[last]
            while cur != -1 and cand[bx][cur] != want:
                cur = sib[bx][cur]
            if cur == -1:
                break
            predicts[last] = want
            accepted += 1
            last = ridx[bx][cur]
            accept_index[bx, accepted] = last
        accept_token_num[bx] = accepted
        predicts[last] = target[last]  # the bonus token


def build_tree_kernel_efficient_cpu(
    parent_list: torch.Tensor,
    selected_index: torch.Tensor,
    verified_seq_len: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int,
) -> None:
    """The verify tree's links, positions and mask, sgl_build_tree_kernel_efficient_triton (spec_tree.py) line by
    line, for tree_mask_mode FULL_MASK (0) and QLEN_ONLY (1). retrive_* arrive filled with -1."""
    if tree_mask_mode not in (0, 1):
        raise NotImplementedError(f"eagle3 cpu_spec: tree_mask_mode {tree_mask_mode} (bit-packed) is not supported")
    ndt = draft_token_num
    seq = verified_seq_len.tolist()
    sel = selected_index.tolist()
    par = parent_list.reshape(len(seq), -1).tolist()
    ridx, nxt, sib = retrive_index.tolist(), retrive_next_token.tolist(), retrive_next_sibling.tolist()
    pos = [0] * (len(seq) * ndt)

    def find(b: int, token: int) -> int | None:
        return next((p for p in range(ndt - 1) if sel[b][p] == token), None)

    rows: list[tuple[int, list[int]]] = []  # (first mask cell of a draft token's row, its cells set to True)
    prefix = 0
    for b, seq_len in enumerate(seq):
        pos[b * ndt] = seq_len
        for i in range(ndt - 1, 0, -1):
            ridx[b][i] = b * ndt + i
            parent_tb = sel[b][i - 1] // topk
            parent_pos: int | None = 0
            if parent_tb != 0:
                found = find(b, par[b][parent_tb])
                parent_pos = None if found is None else found + 1
            if parent_pos is not None:
                if nxt[b][parent_pos] != -1:
                    sib[b][i] = nxt[b][parent_pos]
                nxt[b][parent_pos] = i
        ridx[b][0] = b * ndt
        for x in range(ndt):
            if tree_mask_mode == 0:
                start = ndt * ndt * b + prefix * ndt + (seq_len + ndt) * x + seq_len
            else:
                start = ndt * ndt * b + ndt * x
            cells = [start]  # the root
            if x > 0:
                cur, level = x - 1, 0
                for _ in range(depth):
                    level += 1
                    cells.append(start + 1 + cur)
                    parent_tb = sel[b][cur] // topk
                    if parent_tb == 0:
                        break
                    found = find(b, par[b][parent_tb])
                    if found is None:
                        break
                    cur = found
                pos[b * ndt + x] = seq_len + level
            rows.append((start, cells))
        prefix += seq_len
    for start, cells in rows:
        tree_mask[start : start + ndt] = False
        tree_mask[torch.tensor(cells, dtype=torch.int64)] = True
    positions.copy_(torch.tensor(pos, dtype=positions.dtype))
    retrive_index.copy_(torch.tensor(ridx, dtype=retrive_index.dtype))
    retrive_next_token.copy_(torch.tensor(nxt, dtype=retrive_next_token.dtype))
    retrive_next_sibling.copy_(torch.tensor(sib, dtype=retrive_next_sibling.dtype))


#: name -> (schema, implementation); the names and argument orders of sgl_kernel/speculative.py's wrappers
OPS: dict[str, tuple[str, Callable[..., None]]] = {
    "copy_all_layer_kv_cache_cpu": (
        "(Tensor data_ptrs, Tensor strides, Tensor tgt_loc, Tensor src_loc) -> ()",
        copy_all_layer_kv_cache_cpu,
    ),
    "assign_draft_cache_locs_contiguous_cpu": (
        "(Tensor req_pool_indices, Tensor req_to_token, Tensor seq_lens, Tensor(a!) out_cache_loc, int pool_len, "
        "int topk, int num_steps) -> ()",
        assign_draft_cache_locs_contiguous_cpu,
    ),
    "assign_extend_cache_locs_cpu": (
        "(Tensor req_pool_indices, Tensor req_to_token, Tensor start_offset, Tensor end_offset, "
        "Tensor(a!) out_cache_loc, int pool_len) -> ()",
        assign_extend_cache_locs_cpu,
    ),
    "assign_req_to_token_pool_cpu": (
        "(Tensor req_pool_indices, Tensor(a!) req_to_token, Tensor start_offset, Tensor end_offset, "
        "Tensor out_cache_loc, int pool_len) -> ()",
        assign_req_to_token_pool_cpu,
    ),
    "fill_bonus_tokens_cpu": (
        "(Tensor accept_tokens, Tensor accept_lens, Tensor(a!) bonus_tokens, int accept_stride) -> ()",
        fill_bonus_tokens_cpu,
    ),
    "verify_tree_greedy_cpu": (
        "(Tensor(a!) predicts, Tensor(b!) accept_index, Tensor(c!) accept_token_num, Tensor candidates, "
        "Tensor retrive_index, Tensor retrive_next_token, Tensor retrive_next_sibling, Tensor target_predict) -> ()",
        verify_tree_greedy_cpu,
    ),
    "build_tree_kernel_efficient_cpu": (
        "(Tensor parent_list, Tensor selected_index, Tensor verified_seq_len, Tensor(a!) tree_mask, "
        "Tensor(b!) positions, Tensor(c!) retrive_index, Tensor(d!) retrive_next_token, "
        "Tensor(e!) retrive_next_sibling, int topk, int depth, int draft_token_num, int tree_mask_mode) -> ()",
        build_tree_kernel_efficient_cpu,
    ),
}


def _has_op(name: str) -> bool:
    try:
        getattr(torch.ops.sgl_kernel, name)
    except (AttributeError, RuntimeError):
        return False
    return True


def register_ops() -> list[str]:
    """Define the missing ops under torch.ops.sgl_kernel (CPU kernels); the names registered."""
    global _LIBRARY
    import sgl_kernel  # noqa: F401  (its own registrations come first)

    missing = [name for name in OPS if not _has_op(name)]
    if missing:
        if _LIBRARY is None:
            _LIBRARY = torch.library.Library("sgl_kernel", "FRAGMENT")
        for name in missing:
            schema, fn = OPS[name]
            _LIBRARY.define(name + schema)
            _LIBRARY.impl(name, fn, "CPU")
    return missing


# attention ------------------------------------------------------------------------------------------------------------
def causal_extend_attention(
    backend: Any,
    q: torch.Tensor,
    k: torch.Tensor | None,
    v: torch.Tensor | None,
    layer: Any,
    forward_batch: Any,
    save_kv_cache: bool,
    *,
    seq_lens: torch.Tensor,
    extend_lens: torch.Tensor,
) -> torch.Tensor:
    """Write k/v at forward_batch.out_cache_loc, then for each request attend its extend_lens queries (positions
    seq_lens - extend_lens .. seq_lens - 1) causally over its KV cache, with TorchNativeAttnBackend's own SDPA."""
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    if layer.is_cross_attention or (layer.sliding_window_size is not None and layer.sliding_window_size > -1):
        raise NotImplementedError("eagle3 cpu_spec: cross attention or a sliding window in a speculative pass")
    q = q.reshape(-1, layer.tp_q_head_num * layer.qk_head_dim)
    o = q.new_empty((q.shape[0], layer.tp_q_head_num * layer.v_head_dim))
    if save_kv_cache and k is not None and v is not None:
        backend.token_to_kv_pool.set_kv_buffer(
            layer, KVWriteLoc(forward_batch.out_cache_loc, backend.swa_out_cache_loc), k, v
        )
    backend._run_sdpa_forward_extend(
        q.view(-1, layer.tp_q_head_num, layer.qk_head_dim),
        o.view(-1, layer.tp_q_head_num, layer.v_head_dim),
        backend.token_to_kv_pool.get_key_buffer(layer.layer_id),
        backend.token_to_kv_pool.get_value_buffer(layer.layer_id),
        backend.req_to_token_pool.req_to_token,
        forward_batch.req_pool_indices,
        seq_lens,
        seq_lens - extend_lens,
        extend_lens,
        None,
        scaling=layer.scaling,
        enable_gqa=layer.tp_q_head_num != layer.tp_k_head_num,
        causal=True,
    )
    return o


def _around_forward_extend(
    original: Callable[..., torch.Tensor],
    backend: Any,
    q: torch.Tensor,
    k: torch.Tensor | None,
    v: torch.Tensor | None,
    layer: Any,
    forward_batch: Any,
    save_kv_cache: bool = True,
    **kwargs: Any,
) -> torch.Tensor:
    """TorchNativeAttnBackend.forward_extend, plus TARGET_VERIFY of a chain: draft_token_num tokens after
    seq_lens (forward_batch.seq_lens excludes them), causal."""
    if not forward_batch.forward_mode.is_target_verify():
        return original(backend, q, k, v, layer, forward_batch, save_kv_cache, **kwargs)
    spec = forward_batch.spec_info
    if spec.tree_topk != 1:
        raise NotImplementedError(
            "eagle3 cpu_spec verifies draft chains only: serve with --speculative-eagle-topk 1 on CPU"
        )
    n = int(spec.draft_token_num)
    extend = torch.full((forward_batch.batch_size,), n, dtype=torch.int32, device=forward_batch.seq_lens.device)
    return causal_extend_attention(
        backend, q, k, v, layer, forward_batch, save_kv_cache, seq_lens=forward_batch.seq_lens + n, extend_lens=extend
    )


@functools.cache
def _draft_backend_classes() -> tuple[type, type]:
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    class TorchNativeDraftDecodeStep(TorchNativeAttnBackend):  # type: ignore[misc, valid-type]
        """Draft decode step `step` of a chain: one query per request, at position seq_len + step, which sees
        the prefix and step + 1 draft tokens (its own included); forward_batch.seq_lens stays seq_len."""

        def __init__(self, model_runner: Any, step: int):
            super().__init__(model_runner)
            self.step = step

        def forward_decode(  # type: ignore[override]
            self, q: Any, k: Any, v: Any, layer: Any, forward_batch: Any, save_kv_cache: bool = True, **kwargs: Any
        ) -> torch.Tensor:
            seq_lens = forward_batch.seq_lens + self.step + 1
            ones = torch.ones_like(seq_lens, dtype=torch.int32)
            return causal_extend_attention(
                self, q, k, v, layer, forward_batch, save_kv_cache, seq_lens=seq_lens, extend_lens=ones
            )

    class TorchNativeMultiStepDraftBackend:
        """What the EAGLE worker asks DraftBackendFactory.create_decode_backend for: `attn_backends[i]` runs
        draft step i (num_steps - 1 forwards; the last step only samples)."""

        def __init__(self, model_runner: Any, topk: int, speculative_num_steps: int):
            if topk != 1:
                raise ValueError(
                    f"eagle3 cpu_spec drafts chains only: serve with --speculative-eagle-topk 1 on CPU (got {topk})"
                )
            self.topk = topk
            self.speculative_num_steps = speculative_num_steps
            self.attn_backends = [TorchNativeDraftDecodeStep(model_runner, i) for i in range(speculative_num_steps - 1)]

        def init_forward_metadata(self, forward_batch: Any) -> None:
            for backend in self.attn_backends:
                backend.init_forward_metadata(forward_batch)

    return TorchNativeDraftDecodeStep, TorchNativeMultiStepDraftBackend


def _around_create_backend(
    original: Callable[..., Any],
    factory: Any,
    backend_name: str,
    backend_map: dict[str, Callable[[], tuple[str, Any]]],
    error_template: str,
    stamps_children: bool = False,
) -> Any:
    """DraftBackendFactory._create_backend with a torch_native entry: the multi-step draft decode backend when
    the factory builds the decode one (the only call with stamps_children), else the draft extend backend."""
    if "torch_native" not in backend_map:
        from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

        runner = factory.draft_model_runner
        _, multi_step = _draft_backend_classes()

        def make() -> tuple[str, Any]:
            if stamps_children:
                return "torch_native", multi_step(runner, factory.topk, factory.speculative_num_steps)
            return "torch_native", TorchNativeAttnBackend(runner)

        backend_map = {**backend_map, "torch_native": make}
    return original(factory, backend_name, backend_map, error_template, stamps_children)


# install --------------------------------------------------------------------------------------------------------------
def install() -> list[str]:
    """Register the ops and the hooks (SGLang applies hooks after every plugin has run). Returns the ops
    registered. Raises UnsupportedCpuSpec for an SGLang version whose internals this was not written against."""
    global _INSTALLED
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("sglang")
    except PackageNotFoundError:
        found = "not installed"
    if found not in SUPPORTED_SGLANG:
        raise UnsupportedCpuSpec(
            f"eagle3 cpu_spec supports sglang {', '.join(SUPPORTED_SGLANG)}, found {found}; unset {ENV_SWITCH}"
        )
    from sglang.srt.utils import is_cpu

    if not is_cpu():
        log.info("eagle3 cpu_spec: not a CPU server, nothing to install")
        return []
    if _INSTALLED:
        return []
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    from sglang.srt.speculative import spec_utils

    registered = register_ops()
    HookRegistry.register(
        "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend.forward_extend",
        _around_forward_extend,
        HookType.AROUND,
    )
    HookRegistry.register(
        "sglang.srt.speculative.draft_utils.DraftBackendFactory._create_backend",
        _around_create_backend,
        HookType.AROUND,
    )
    eager = getattr(spec_utils._select_top_k_tokens_later, "_torchdynamo_orig_callable", None)
    if eager is not None:
        HookRegistry.register("sglang.srt.speculative.spec_utils._select_top_k_tokens_later", eager, HookType.REPLACE)
    _INSTALLED = True
    log.warning(
        "eagle3 cpu_spec: %s=1, EAGLE3 chain drafting on CPU through the torch_native fallback "
        "(sgl_kernel ops registered: %s)",
        ENV_SWITCH,
        ", ".join(registered) or "none",
    )
    return registered
