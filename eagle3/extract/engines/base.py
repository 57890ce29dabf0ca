"""What an engine is: something that turns prepared samples into hidden states in the store format.

The extraction loop (eagle3/extract/shard.py) is engine-agnostic. An engine yields one outcome per sample:
  Captured: tensors in this process (transformers engine), written to the store by a background writer;
  Dumped:   a finished sample file written by another process (SGLang's hook), verified and moved in;
  Failed:   a reason recorded in the shard manifest.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from eagle3.store.run_store import PreparedSample


@dataclass
class Captured:
    sample: PreparedSample
    aux_hidden_states: torch.Tensor  # [T, K, H], CPU, model dtype (or float8_e4m3fn for an FP8 store)
    last_hidden_state: torch.Tensor  # [T, H], CPU, model dtype (or float8_e4m3fn)
    aux_scales: torch.Tensor | None = None  # [T, K] float32, FP8 only (eagle3.store.sample_format.quantize_fp8)
    last_scale: torch.Tensor | None = None  # [T] float32, FP8 only


@dataclass
class Dumped:
    sample: PreparedSample
    path: Path  # a complete sample file in the store format, outside the store


@dataclass
class Failed:
    sample: PreparedSample
    reason: str


Outcome = Captured | Dumped | Failed


@dataclass(frozen=True)
class EngineInfo:
    """Recorded in run.json."""

    name: str
    version: str
    aux_layers: list[int]  # HF hidden_states indices
    engine_layer_ids: list[int]  # the same layers in the engine's convention
    engine_layer_convention: str


class Engine(Protocol):
    info: EngineInfo

    def extract(self, samples: Sequence[PreparedSample]) -> Iterator[Outcome]:
        """One outcome per sample, in any order. Must not raise for a per-sample problem (yield Failed)."""
        ...

    def close(self) -> None: ...
