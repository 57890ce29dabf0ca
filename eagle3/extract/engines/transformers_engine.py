"""The in-process engine: Hugging Face transformers, batched by length. The reference for parity.

One forward per batch of samples (sorted by length, packed up to `batch_tokens` padded tokens,
right padding). We call the base model (no lm_head, so no [B, S, vocab] logits) with
`output_hidden_states=True`; its `hidden_states` tuple is exactly the store's index space
(0 = embeddings, i = input of decoder layer i) and its last entry is the final post-norm state.
Each sample's rows [:T] are sliced back out, so padding never reaches the store. For an FP8 store
(extract.store_dtype: float8_e4m3) the batch is quantized on the device (eagle3.store.sample_format.quantize_fp8)
before the device-to-host copy, so the copy and the writers move half the bytes. On CUDA two batches stay
queued on the device while the host hands the oldest one on.
"""

from __future__ import annotations

import importlib.metadata
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from eagle3.device import torch_device
from eagle3.extract.engines.base import Captured, EngineInfo, Failed, Outcome
from eagle3.serving.aux_layers import resolve_aux_layers
from eagle3.store.run_store import DTYPES, PreparedSample
from eagle3.store.sample_format import FP8_NAME, quantize_fp8
from eagle3.target.files import read_model_facts
from eagle3.target.load import decoder_stack, load_causal_lm

CONVENTION = "hf_hidden_states"
INFLIGHT = 2  # launched batches queued on the device while the host hands one on (2 vs 1: +11%, docs/performance.md)


_hint = threading.local()
_hint_lock = threading.Lock()


@contextmanager
def rows_not_packed() -> Iterator[None]:
    """Inside: transformers' packed-sequence check answers "not packed" without looking, for this thread only.

    For a forward without an attention mask, transformers (masking_utils.find_packed_sequence_indices) looks for
    several sequences packed in one row by reading a device value: the host waits for the GPU once per batch, so
    it cannot launch the next batch while this one runs (docs/performance.md, FP8 store). Our rows are single
    sequences (positions 0..S-1, right padding), for which the check's answer is always None; we give it without
    the read. Installed once per process, a no-op in other threads and outside the block, and nothing at all with a
    transformers that has no such function."""
    import transformers.masking_utils as mu

    with _hint_lock:
        check = getattr(mu, "find_packed_sequence_indices", None)
        if check is not None and not getattr(check, "eagle3_hint", False):

            def find_packed_sequence_indices(position_ids: torch.Tensor) -> torch.Tensor | None:
                return None if getattr(_hint, "unpacked", False) else check(position_ids)

            find_packed_sequence_indices.eagle3_hint = True  # type: ignore[attr-defined]
            mu.find_packed_sequence_indices = find_packed_sequence_indices
    outer = getattr(_hint, "unpacked", False)  # a nested block leaves the hint as the outer one set it
    _hint.unpacked = True
    try:
        yield
    finally:
        _hint.unpacked = outer


class LoadedModels:
    """Causal LMs loaded once for whoever holds this object: the engines of one server pool on one device share one
    copy of the weights. Not process-wide: the weights go when the holder calls `clear()` or lets go of it."""

    def __init__(self) -> None:
        self._models: dict[tuple[str, str, str], Any] = {}  # (resolved path, device, dtype) -> loaded causal LM
        self._lock = threading.Lock()  # engines in several threads: one load, the others wait for it

    def get(self, model_dir: Path, device: torch.device, dtype: torch.dtype) -> Any:
        key = (str(Path(model_dir).resolve()), str(device), str(dtype))
        with self._lock:
            if key not in self._models:
                self._models[key] = load_causal_lm(model_dir, dtype, device)
            return self._models[key]

    def clear(self) -> None:
        with self._lock:
            self._models.clear()


def length_batches(samples: Sequence[PreparedSample], batch_tokens: int) -> list[list[PreparedSample]]:
    """Group samples by length (longest first) so each batch's padded size B x S_max <= batch_tokens.

    A sample longer than batch_tokens gets a batch of its own.
    """
    batches: list[list[PreparedSample]] = []
    current: list[PreparedSample] = []
    for s in sorted(samples, key=len, reverse=True):
        s_max = len(current[0]) if current else len(s)  # sorted: the first one is the longest
        if current and (len(current) + 1) * s_max > batch_tokens:
            batches.append(current)
            current = []
        current.append(s)
    if current:
        batches.append(current)
    return batches


def pad_right(batch: Sequence[PreparedSample]) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids [B, S] (padded with id 0) and attention_mask [B, S] (1 = real token)."""
    s_max = max(len(s) for s in batch)
    ids = torch.zeros(len(batch), s_max, dtype=torch.long)  # [B, S]
    mask = torch.zeros(len(batch), s_max, dtype=torch.long)  # [B, S]
    for b, s in enumerate(batch):
        ids[b, : len(s)] = torch.tensor(s.input_ids, dtype=torch.long)
        mask[b, : len(s)] = 1
    return ids, mask


class TransformersEngine:
    """Runs the target model in this process. The model loads on the first `extract` call, so a
    caller can build the engine, read `info`, and skip finished shards without loading weights. Engines given the
    same `models` share the weights (a server pool's engines); without it the engine loads its own. `inflight`: how
    many launched batches stay queued on the device while the host hands the oldest one's states on."""

    def __init__(
        self,
        model_dir: Path,
        *,
        aux_layers: list[int] | None = None,
        device: str = "auto",
        dtype: str = "bfloat16",
        batch_tokens: int = 8192,
        store_dtype: str = "bfloat16",
        models: LoadedModels | None = None,
        inflight: int = INFLIGHT,
    ):
        if dtype not in DTYPES:
            raise ValueError(f"server.dtype {dtype!r}: expected one of {sorted(DTYPES)}")
        if store_dtype not in ("bfloat16", FP8_NAME):
            raise ValueError(f"extract.store_dtype {store_dtype!r}: expected 'bfloat16' or {FP8_NAME!r}")
        if batch_tokens <= 0:
            raise ValueError(f"server.batch_tokens must be positive, got {batch_tokens}")
        if inflight < 1:
            raise ValueError(f"inflight must be at least 1, got {inflight}")
        facts = read_model_facts(Path(model_dir))
        self.model_dir = Path(model_dir)
        self.vocab_size = facts.vocab_size
        self.device = torch_device(device)
        self.dtype = DTYPES[dtype]
        self.batch_tokens = batch_tokens
        self.fp8 = store_dtype == FP8_NAME
        self.inflight = inflight  # batches left running on the device while the host hands one on
        layers = resolve_aux_layers(aux_layers, facts.num_layers)
        self.info = EngineInfo(
            name="transformers",
            version=importlib.metadata.version("transformers"),
            aux_layers=layers,
            engine_layer_ids=list(layers),  # this engine speaks HF indices natively
            engine_layer_convention=CONVENTION,
        )
        self._models = models if models is not None else LoadedModels()
        self._model: Any = None
        self._copy_stream: torch.cuda.Stream | None = None

    @property
    def loaded(self) -> bool:
        return self._model is not None

    def base_model(self) -> Any:
        """The decoder stack without the lm_head (LlamaModel for LlamaForCausalLM)."""
        if self._model is None:
            self._model = self._models.get(self.model_dir, self.device, self.dtype)
        return decoder_stack(self._model)

    def extract(self, samples: Sequence[PreparedSample]) -> Iterator[Outcome]:
        good: list[PreparedSample] = []
        for s in samples:
            reason = self._invalid(s)
            if reason:
                yield Failed(s, reason)
            else:
                good.append(s)
        # Batches launched and not yet handed on, oldest first. Up to `inflight` stay queued on the device while the
        # host waits for the oldest one's copy and hands its samples to the writers, so a slow hand-off (writers
        # holding the GIL, a full writer queue) does not leave the GPU idle.
        pending: deque[InFlight] = deque()
        for batch in length_batches(good, self.batch_tokens):
            try:
                pending.append(self.launch(batch))
            except torch.OutOfMemoryError:
                while pending:
                    yield from pending.popleft().outcomes()
                yield from self._retry_alone(batch)
                continue
            while len(pending) > self.inflight:
                yield from pending.popleft().outcomes()
        while pending:
            yield from pending.popleft().outcomes()

    def close(self) -> None:
        self._model = None  # `models` keeps the weights until its holder clears it (a server pool: when it closes)

    @torch.inference_mode()
    def launch(self, batch: Sequence[PreparedSample]) -> InFlight:
        """Run one padded batch; its states arrive on the CPU when `InFlight.outcomes` is read."""
        base = self.base_model()
        with rows_not_packed():
            out = base(input_ids=self.input_ids(batch), output_hidden_states=True, use_cache=False)
        hs = out.hidden_states  # N+1 x [B, S, H]; hs[-1] is the post-norm output
        aux = torch.stack([hs[i] for i in self.info.aux_layers], dim=2)  # [B, S, K, H]
        last = out.last_hidden_state  # [B, S, H]
        tensors = [aux, last]
        if self.fp8:  # on the device, before the copy: [B, S, K, H] fp8 + [B, S, K] scales, [B, S, H] + [B, S]
            del hs, out
            (qa, sa), (ql, sl) = quantize_fp8(aux), quantize_fp8(last)
            tensors = [qa, ql, sa, sl]
        if self.device.type != "cuda":
            return InFlight.of(list(batch), [x.to("cpu") for x in tensors], None)
        return self._copy_to_host(list(batch), tensors)

    def input_ids(self, batch: Sequence[PreparedSample]) -> torch.Tensor:
        """The batch's input ids [B, S] on the device, right-padded. No attention mask goes with them: with right
        padding and causal attention no real row ever sees a padding row (the states are identical, tested), and a
        padding mask makes transformers build a 4D mask and wait for the device, which serialised the host's work
        with the GPU's (docs/performance.md)."""
        ids, _ = pad_right(batch)  # [B, S]
        if self.device.type == "cuda":  # a pageable copy would wait for the previous batch's forward
            return ids.pin_memory().to(self.device, non_blocking=True)
        return ids.to(self.device)

    # -------------------------------------------------------------------------------------
    def _copy_to_host(self, batch: list[PreparedSample], tensors: list[torch.Tensor]) -> InFlight:
        """Device -> pinned host copies on a side stream, so they overlap the next batch's forward."""
        if self._copy_stream is None:
            self._copy_stream = torch.cuda.Stream(self.device)
        stream = self._copy_stream
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            host = [torch.empty(x.shape, dtype=x.dtype, pin_memory=True) for x in tensors]
            for h, x in zip(host, tensors, strict=True):
                h.copy_(x, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record(stream)
        for x in tensors:
            x.record_stream(stream)  # keep the allocator from reusing them before the copy is done
        return InFlight.of(batch, host, ready)

    def _retry_alone(self, batch: list[PreparedSample]) -> Iterator[Outcome]:
        """After an out-of-memory batch: each sample on its own; one that still does not fit fails."""
        for s in batch:
            self._free_device_cache()
            try:
                one = self.launch([s])
            except torch.OutOfMemoryError:
                yield Failed(s, f"out of memory at {len(s)} tokens on {self.device}; lower server.batch_tokens "
                                "or data.max_length")  # fmt: skip
                continue
            yield from one.outcomes()

    def _free_device_cache(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _invalid(self, s: PreparedSample) -> str | None:
        if len(s) == 0:
            return "empty sample (0 tokens)"
        lo, hi = min(s.input_ids), max(s.input_ids)
        if lo < 0 or hi >= self.vocab_size:
            return f"token id out of range [0, {self.vocab_size}): min {lo}, max {hi}"
        return None


@dataclass
class InFlight:
    """A batch whose states are on their way to host memory."""

    batch: list[PreparedSample]
    aux: torch.Tensor  # [B, S, K, H] on CPU (pinned on CUDA); float8_e4m3fn for an FP8 store
    last: torch.Tensor  # [B, S, H]
    aux_scales: torch.Tensor | None = None  # [B, S, K] float32, FP8 only
    last_scale: torch.Tensor | None = None  # [B, S] float32, FP8 only
    ready: torch.cuda.Event | None = None  # set when the device -> host copy is done (None: already there)

    @classmethod
    def of(cls, batch: list[PreparedSample], host: list[torch.Tensor], ready: torch.cuda.Event | None) -> InFlight:
        """From [aux, last] or, quantized, [aux, last, aux_scales, last_scale]."""
        if len(host) == 4:
            return cls(batch, host[0], host[1], host[2], host[3], ready)
        return cls(batch, host[0], host[1], None, None, ready)

    def outcomes(self) -> Iterator[Outcome]:
        if self.ready is not None:
            self.ready.synchronize()
        for b, s in enumerate(self.batch):
            t = len(s)
            sa = None if self.aux_scales is None else self.aux_scales[b, :t]  # [T, K]
            sl = None if self.last_scale is None else self.last_scale[b, :t]  # [T]
            yield Captured(s, self.aux[b, :t], self.last[b, :t], sa, sl)  # unpadded views: [T, K, H], [T, H]
