"""What the converters share: errors, result records, layer-index conventions, fast tensor I/O.

Layer conventions (docs/formats.md spells them out):
  ours (HF)       i = `hidden_states[i]` of a transformers forward: 0 = embeddings, i = input of decoder layer i
  SpecForge/SGLang  x = output of decoder layer x            -> HF x + 1   (Llama/Qwen family in SGLang)
  vLLM/speculators  k = input of decoder layer k (residual)  -> HF k, for 0 < k < N; k = N is the final layer's
                    output BEFORE the final norm, which our store does not keep (it keeps the post-norm state)
"""

from __future__ import annotations

import json
import math
import mmap
import struct
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal, TypeVar

import torch
from pydantic import BaseModel, ConfigDict, Field

from eagle3.store.run_store import DTYPES, RunInfo
from eagle3.store.sample_format import ST_DTYPES, SampleTensors, check_header, read_header, state_keys

SIDECAR = "eagle3_export.json"  # written by our exporters beside the peer data; peers ignore it
SIDECAR_FORMAT = "eagle3-export/1"
ST_NAMES = {v: k for k, v in ST_DTYPES.items()}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}

T = TypeVar("T")
R = TypeVar("R")


class PeerFormatError(ValueError):
    """A peer directory (SpecForge or speculators) that is not what its reader expects; names the file."""


class ConvertError(ValueError):
    """A store that cannot be converted (no run.json, no samples, bad token ids); names the path."""


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


# layer conventions ----------------------------------------------------------------------------
def hf_to_specforge(aux_layers: list[int]) -> list[int]:
    """HF hidden_states indices -> SpecForge/SGLang `eagle_aux_hidden_state_layer_ids` (output of layer x)."""
    return [i - 1 for i in aux_layers]


def specforge_to_hf(layer_ids: list[int]) -> list[int]:
    return [x + 1 for x in layer_ids]


def hf_to_vllm(aux_layers: list[int], num_layers: int) -> list[int]:
    """HF indices -> vLLM/speculators ids (input of layer k), plus N for the verifier's last state."""
    if num_layers in aux_layers:
        raise PeerFormatError(
            f"aux layer {num_layers} is HF's post-norm final state; vLLM id {num_layers} is the pre-norm one, "
            "so it has no exact vLLM id. Extract with aux layers below the model depth."
        )
    return [*aux_layers, num_layers]


def vllm_to_hf(layer_ids: list[int], num_layers: int, where: str) -> list[int]:
    """vLLM ids as passed to vLLM (aux ids, then N for the last state) -> HF indices of the aux slots."""
    if len(layer_ids) < 2 or layer_ids[-1] != num_layers:
        raise PeerFormatError(
            f"{where}: vllm_layer_ids {layer_ids} must end with the model depth {num_layers} (the verifier's last "
            "state, as speculators' launch_vllm.py --include-last-layer appends it)"
        )
    aux = layer_ids[:-1]
    bad = [k for k in aux if not 0 < k < num_layers]
    if bad:
        raise PeerFormatError(f"{where}: vllm_layer_ids {layer_ids}: {bad} out of range 1..{num_layers - 1}")
    return list(aux)


# records ----------------------------------------------------------------------------------------
class TargetModel(Record):
    """The target model facts an import needs when the peer data does not carry them."""

    model_path: str = Field(description="Where the target model lives (recorded in run.json).")
    num_layers: int = Field(gt=0, description="Decoder layers N (config.json num_hidden_layers).")
    vocab_size: int = Field(gt=0, description="Target vocabulary (config.json vocab_size).")
    model_sha256: str = "unknown"
    tokenizer_sha256: str = "unknown"

    @classmethod
    def from_model_dir(cls, model_dir: str | Path) -> TargetModel:
        from eagle3.target.files import model_fingerprint, read_model_facts, tokenizer_fingerprint

        path = Path(model_dir)
        facts = read_model_facts(path)
        return cls(
            model_path=str(path),
            num_layers=facts.num_layers,
            vocab_size=facts.vocab_size,
            model_sha256=model_fingerprint(path),
            tokenizer_sha256=tokenizer_fingerprint(path),
        )


class SidecarSample(Record):
    index: int
    shard: int
    sample_id: str
    num_tokens: int


class ExportSidecar(Record):
    """eagle3_export.json: what an export came from, so importing it back is exact."""

    format: str = SIDECAR_FORMAT
    peer: Literal["specforge", "speculators"]
    run_info: dict[str, Any]
    aux_layers: list[int] = Field(description="HF hidden_states indices")
    peer_layer_ids: list[int] = Field(description="the same layers in the peer's convention")
    peer_layer_convention: str
    last_state: Literal["post_norm", "norm_input"] = Field(
        "post_norm",
        description="the speculators last slot: our post-norm state, or (norm_input) that state divided by the "
        "final norm's weight, which speculators' verifier norm maps back to it (docs/formats.md)",
    )
    samples: list[SidecarSample]


class PeerExportResult(Record):
    peer: str
    out_dir: str
    num_samples: int
    num_tokens: int
    bytes_read: int
    bytes_written: int
    skipped: int = Field(default=0, description="files already present from an earlier, interrupted export")
    elapsed_s: float
    peer_layer_ids: list[int]
    notes: list[str] = Field(default_factory=list)


class ImportResult(Record):
    peer: str
    src_dir: str
    run_dir: str
    num_samples: int
    num_tokens: int
    num_shards: int
    aux_layers: list[int]
    peer_layer_ids: list[int]
    used_sidecar: bool
    trimmed_rows: int = 0
    skipped_missing: list[str] = Field(default_factory=list)
    elapsed_s: float
    notes: list[str] = Field(default_factory=list)


def read_sidecar(src: Path, peer: str) -> ExportSidecar | None:
    path = src / SIDECAR
    if not path.is_file():
        return None
    try:
        side = ExportSidecar.model_validate(json.loads(path.read_text()))
    except Exception as e:
        raise PeerFormatError(f"{path}: not a valid {SIDECAR_FORMAT} sidecar ({e})") from None
    if side.peer != peer:
        raise PeerFormatError(f"{path}: written for {side.peer!r}, not {peer!r}")
    return side


def require_run_info(store: Any) -> RunInfo:
    info: RunInfo | None = store.read_run_info()
    if info is None:
        raise ConvertError(f"{store.run_json} missing: run the extract stage (or an import) first")
    return info


# fast tensor I/O ----------------------------------------------------------------------------------
def read_store_sample(path: Path, info: RunInfo) -> SampleTensors:
    """A store sample, after the header check, as tensors over a private memory map of the file.

    No read copy: the pages come from the page cache and are shared until written (ACCESS_COPY, so the
    tensors are writable and the file is never changed). Used by the exporters, which only read them.
    """
    check_header(path, num_tokens=None, num_aux=len(info.aux_layers), hidden_size=info.hidden_size,
                 dtype=info.stored)  # fmt: skip
    header, n, _ = read_header(path)
    with open(path, "rb") as f:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    out = {}
    for key in state_keys(info.stored):
        h = header[key]
        dt = ST_DTYPES[h["dtype"]]
        a, b = h["data_offsets"]
        count = (b - a) // dt.itemsize
        t = torch.frombuffer(buf, dtype=dt, offset=8 + n + a, count=count) if count else torch.empty(0, dtype=dt)
        out[key] = t.view(h["shape"])
    return SampleTensors(**out)


def safetensors_header(tensors: list[tuple[str, torch.dtype, list[int]]]) -> tuple[bytes, list[int]]:
    """The 8-byte length + JSON header of a safetensors file holding these tensors back to back, in order,
    and each tensor's start within the data section."""
    header: dict[str, Any] = {}
    starts, off = [], 0
    for name, dtype, shape in tensors:
        nbytes = math.prod(shape) * dtype.itemsize
        header[name] = {"dtype": ST_NAMES[dtype], "shape": shape, "data_offsets": [off, off + nbytes]}
        starts.append(off)
        off += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw, starts


def ordered_map(fn: Callable[[T], R], items: Iterable[T], workers: int) -> Iterator[R]:
    """`map` on a thread pool with at most 4*workers tasks in flight; results in input order."""
    if workers <= 1:
        yield from map(fn, items)
        return
    with ThreadPoolExecutor(max_workers=workers) as pool:
        pending: deque[Future[R]] = deque()
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) >= 4 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
