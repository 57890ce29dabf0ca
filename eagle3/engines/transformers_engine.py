"""The in-process engine: Hugging Face transformers, batched by length. The reference for parity.

One forward per batch of samples (sorted by length, packed up to `batch_tokens` padded tokens,
right padding). We call the base model (no lm_head, so no [B, S, vocab] logits) with
`output_hidden_states=True`; its `hidden_states` tuple is exactly the store's index space
(0 = embeddings, i = input of decoder layer i) and its last entry is the final post-norm state.
Each sample's rows [:T] are sliced back out, so padding never reaches the store.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from eagle3.engines.base import Captured, EngineInfo, Failed, Outcome
from eagle3.layers import resolve_aux_layers
from eagle3.model_files import read_model_facts
from eagle3.store import DTYPES, PreparedSample

CONVENTION = "hf_hidden_states"
_MODELS: dict[tuple[str, str, str], Any] = {}  # (resolved path, device, dtype) -> loaded causal LM


def resolve_device(device: str) -> torch.device:
    """`auto` -> cuda when available, else cpu."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def load_causal_lm(model_dir: Path, device: torch.device, dtype: torch.dtype) -> Any:
    """AutoModelForCausalLM in eval mode, loaded once per process for each (path, device, dtype)."""
    key = (str(Path(model_dir).resolve()), str(device), str(dtype))
    if key not in _MODELS:
        from transformers import AutoModelForCausalLM

        model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
        _MODELS[key] = model.to(device).eval()
    return _MODELS[key]


def clear_model_cache() -> None:
    _MODELS.clear()


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
    caller can build the engine, read `info`, and skip finished shards without loading weights."""

    def __init__(
        self,
        model_dir: Path,
        *,
        aux_layers: list[int] | None = None,
        device: str = "auto",
        dtype: str = "bfloat16",
        batch_tokens: int = 8192,
    ):
        if dtype not in DTYPES:
            raise ValueError(f"server.dtype {dtype!r}: expected one of {sorted(DTYPES)}")
        if batch_tokens <= 0:
            raise ValueError(f"server.batch_tokens must be positive, got {batch_tokens}")
        facts = read_model_facts(Path(model_dir))
        self.model_dir = Path(model_dir)
        self.vocab_size = facts.vocab_size
        self.device = resolve_device(device)
        self.dtype = DTYPES[dtype]
        self.batch_tokens = batch_tokens
        layers = resolve_aux_layers(aux_layers, facts.num_layers)
        self.info = EngineInfo(
            name="transformers",
            version=importlib.metadata.version("transformers"),
            aux_layers=layers,
            engine_layer_ids=list(layers),  # this engine speaks HF indices natively
            engine_layer_convention=CONVENTION,
        )
        self._model: Any = None

    @property
    def loaded(self) -> bool:
        return self._model is not None

    def base_model(self) -> Any:
        """The decoder stack without the lm_head (LlamaModel for LlamaForCausalLM)."""
        if self._model is None:
            self._model = load_causal_lm(self.model_dir, self.device, self.dtype)
        return self._model.base_model

    def extract(self, samples: Sequence[PreparedSample]) -> Iterator[Outcome]:
        good: list[PreparedSample] = []
        for s in samples:
            reason = self._invalid(s)
            if reason:
                yield Failed(s, reason)
            else:
                good.append(s)
        for batch in length_batches(good, self.batch_tokens):
            yield from self._run_batch(batch)

    def close(self) -> None:
        self._model = None  # the per-process cache keeps the weights for the next shard

    # -------------------------------------------------------------------------------------
    def _invalid(self, s: PreparedSample) -> str | None:
        if len(s) == 0:
            return "empty sample (0 tokens)"
        lo, hi = min(s.input_ids), max(s.input_ids)
        if lo < 0 or hi >= self.vocab_size:
            return f"token id out of range [0, {self.vocab_size}): min {lo}, max {hi}"
        return None

    def _run_batch(self, batch: list[PreparedSample]) -> Iterator[Outcome]:
        try:
            aux, last = self.forward(batch)  # [B, S, K, H], [B, S, H] on CPU
        except torch.OutOfMemoryError:
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            if len(batch) > 1:  # retry one at a time before giving up on anyone
                for s in batch:
                    yield from self._run_batch([s])
                return
            yield Failed(batch[0], f"out of memory at {len(batch[0])} tokens on {self.device}")
            return
        for b, s in enumerate(batch):
            t = len(s)
            yield Captured(s, aux[b, :t], last[b, :t])  # unpadded views: [T, K, H], [T, H]

    @torch.inference_mode()
    def forward(self, batch: Sequence[PreparedSample]) -> tuple[torch.Tensor, torch.Tensor]:
        """aux [B, S, K, H] and last [B, S, H] on CPU in the model dtype (rows past each length are padding)."""
        ids, mask = pad_right(batch)  # [B, S]
        out = self.base_model()(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device) if len(batch) > 1 else None,
            output_hidden_states=True,
            use_cache=False,
        )
        hs = out.hidden_states  # N+1 x [B, S, H]; hs[-1] is the post-norm output
        aux = torch.stack([hs[i] for i in self.info.aux_layers], dim=2)  # [B, S, K, H]
        return aux.to("cpu"), out.last_hidden_state.to("cpu")
