"""One sample of hidden states on disk: the store's file format (docs/formats.md).

A sample file is safetensors with exactly these tensors, unpadded:
    input_ids          int64  [T]
    loss_mask          uint8  [T]
    aux_hidden_states  dtype  [T, K, H]   HF hidden_states[aux_layers], stacked on dim 1
    last_hidden_state  dtype  [T, H]      final post-norm state
and `__metadata__` {"format", "sample_id", "aux_layers"}.

This module imports only torch, safetensors and the standard library: server_patch uses it inside
SGLang's processes, so the writer there and the reader here are one piece of code.
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load

from eagle3.fsio import atomic_write_bytes, atomic_write_parts

FORMAT = "eagle3-sample/1"
KEYS = ("input_ids", "loss_mask", "aux_hidden_states", "last_hidden_state")
ST_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "I64": torch.int64, "U8": torch.uint8}
_DTYPE_NAMES = {v: k for k, v in ST_DTYPES.items()}
MAX_HEADER = 1 << 20


class SampleFormatError(ValueError):
    """A sample file that is missing, truncated, or not what the run expects. The message names the file."""


@dataclass(frozen=True)
class SampleRecord:
    """What a manifest keeps about one written sample."""

    num_tokens: int
    num_bytes: int
    crc32: str


@dataclass
class SampleTensors:
    input_ids: torch.Tensor  # [T] int64
    loss_mask: torch.Tensor  # [T] uint8
    aux_hidden_states: torch.Tensor  # [T, K, H]
    last_hidden_state: torch.Tensor  # [T, H]


def encode_sample(
    sample_id: str,
    aux_layers: list[int],
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    aux_hidden_states: torch.Tensor,
    last_hidden_state: torch.Tensor,
) -> bytes:
    """The sample file's bytes. Built by `encode_sample_parts`, not safetensors' `save`, whose header key order
    changes from process to process: the same sample must give the same bytes (and crc32) in every process."""
    return b"".join(encode_sample_parts(sample_id, aux_layers, input_ids, loss_mask, aux_hidden_states,
                                        last_hidden_state))  # fmt: skip


def encode_sample_parts(
    sample_id: str,
    aux_layers: list[int],
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    aux_hidden_states: torch.Tensor,
    last_hidden_state: torch.Tensor,
) -> list[bytes | memoryview]:
    """The same file as `encode_sample`, as [header, raw bytes of each tensor] with no copy of the
    tensor data, for `write_sample_parts` to stream to disk. The layout follows safetensors: data
    ordered by element size (largest first) then name, header JSON padded with spaces to 8 bytes."""
    tensors = _sample_tensors(sample_id, aux_layers, input_ids, loss_mask, aux_hidden_states, last_hidden_state)
    header: dict = {"__metadata__": _metadata(sample_id, aux_layers)}
    views: list[bytes | memoryview] = []
    offset = 0
    for key in sorted(tensors, key=lambda k: (-tensors[k].element_size(), k)):
        x = tensors[key]
        raw = x.reshape(-1).view(torch.uint8).numpy()  # the tensor's own memory, as bytes
        header[key] = {
            "dtype": _DTYPE_NAMES[x.dtype],
            "shape": list(x.shape),
            "data_offsets": [offset, offset + raw.nbytes],
        }
        views.append(raw.data)
        offset += raw.nbytes
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    return [struct.pack("<Q", len(head)) + head, *views]


def write_sample_parts(path: Path, parts: list[bytes | memoryview], num_tokens: int) -> SampleRecord:
    """Atomically write what `encode_sample_parts` returned; returns the manifest record."""
    crc = 0
    for part in parts:
        crc = zlib.crc32(part, crc)
    atomic_write_parts(path, parts)
    return SampleRecord(num_tokens=num_tokens, num_bytes=sum(len(p) for p in parts), crc32=f"{crc:08x}")


def _metadata(sample_id: str, aux_layers: list[int]) -> dict[str, str]:
    return {"format": FORMAT, "sample_id": sample_id, "aux_layers": ",".join(map(str, aux_layers))}


def _sample_tensors(
    sample_id: str,
    aux_layers: list[int],
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    aux_hidden_states: torch.Tensor,
    last_hidden_state: torch.Tensor,
) -> dict[str, torch.Tensor]:
    t = input_ids.shape[0]
    if loss_mask.shape != (t,) or aux_hidden_states.shape[0] != t or last_hidden_state.shape[0] != t:
        raise SampleFormatError(
            f"sample {sample_id}: token counts disagree: input_ids {tuple(input_ids.shape)}, loss_mask "
            f"{tuple(loss_mask.shape)}, aux {tuple(aux_hidden_states.shape)}, last {tuple(last_hidden_state.shape)}"
        )
    if aux_hidden_states.shape[1] != len(aux_layers):
        raise SampleFormatError(
            f"sample {sample_id}: aux_hidden_states has {aux_hidden_states.shape[1]} layers, expected {len(aux_layers)}"
        )
    return {
        "input_ids": input_ids.to(torch.int64).contiguous(),
        "loss_mask": loss_mask.to(torch.uint8).contiguous(),
        "aux_hidden_states": aux_hidden_states.contiguous(),
        "last_hidden_state": last_hidden_state.contiguous(),
    }


def write_sample(path: Path, data: bytes) -> SampleRecord:
    """Atomically write encoded sample bytes; returns the manifest record."""
    atomic_write_bytes(path, data)
    return record_of(data)


def record_of(data: bytes | memoryview) -> SampleRecord:
    header = read_header_bytes(data, "<memory>")
    t = header["input_ids"]["shape"][0]
    return SampleRecord(num_tokens=t, num_bytes=len(data), crc32=f"{zlib.crc32(data):08x}")


def read_header_bytes(data: bytes | memoryview, where: str) -> dict:
    if len(data) < 8:
        raise SampleFormatError(f"{where}: {len(data)} bytes, too short for a safetensors file")
    (n,) = struct.unpack("<Q", data[:8])
    if n > MAX_HEADER or 8 + n > len(data):
        raise SampleFormatError(f"{where}: header length {n} does not fit in {len(data)} bytes (truncated?)")
    return json.loads(bytes(data[8 : 8 + n]))


def read_header(path: Path) -> tuple[dict, int, int]:
    """The safetensors header of a file, its length and the file size; raises SampleFormatError."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise SampleFormatError(f"{path}: truncated (no safetensors header)")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER:
                raise SampleFormatError(f"{path}: header length {n} is not plausible (corrupt file)")
            raw = f.read(n)
            size = f.seek(0, 2)
    except FileNotFoundError:
        raise SampleFormatError(f"{path}: missing") from None
    if len(raw) < n:
        raise SampleFormatError(f"{path}: truncated inside the header")
    try:
        return json.loads(raw), n, size
    except json.JSONDecodeError as e:
        raise SampleFormatError(f"{path}: header is not JSON ({e})") from None


def check_header(
    path: Path,
    *,
    num_tokens: int | None,
    num_aux: int,
    hidden_size: int,
    dtype: torch.dtype,
) -> int:
    """Cheap check (header and size only) that a file is a complete sample of the expected shape.

    Returns the token count. Used on resume for every existing file; `verify_sample` does the full check.
    """
    header, n, size = read_header(path)
    meta = header.pop("__metadata__", {}) or {}
    if meta.get("format") != FORMAT:
        raise SampleFormatError(f"{path}: format {meta.get('format')!r}, expected {FORMAT!r}")
    if set(header) != set(KEYS):
        raise SampleFormatError(f"{path}: keys {sorted(header)}, expected {sorted(KEYS)}")
    t = header["input_ids"]["shape"][0] if header["input_ids"]["shape"] else -1
    expect = {
        "input_ids": ("I64", [t]),
        "loss_mask": ("U8", [t]),
        "aux_hidden_states": (_DTYPE_NAMES[dtype], [t, num_aux, hidden_size]),
        "last_hidden_state": (_DTYPE_NAMES[dtype], [t, hidden_size]),
    }
    end = 0
    for key, (dt, shape) in expect.items():
        h = header[key]
        if h["dtype"] != dt or h["shape"] != shape:
            raise SampleFormatError(f"{path}: {key} is {h['dtype']}{h['shape']}, expected {dt}{shape}")
        end = max(end, h["data_offsets"][1])
    if size != 8 + n + end:
        raise SampleFormatError(f"{path}: {size} bytes, expected {8 + n + end} (truncated or padded)")
    if num_tokens is not None and t != num_tokens:
        raise SampleFormatError(f"{path}: {t} tokens, the prepared sample has {num_tokens}")
    return int(t)


def read_sample(path: Path) -> SampleTensors:
    """Load a sample into memory (tensors own their storage)."""
    data = Path(path).read_bytes()
    try:
        t = load(data)
    except Exception as e:  # safetensors raises its own error types
        raise SampleFormatError(f"{path}: cannot be read as safetensors ({e})") from None
    return SampleTensors(**{k: t[k] for k in KEYS})


def verify_sample(
    path: Path,
    *,
    num_tokens: int | None,
    num_aux: int,
    hidden_size: int,
    dtype: torch.dtype,
    crc32: str | None = None,
    input_ids: torch.Tensor | None = None,
) -> SampleRecord:
    """Full check: header, shapes, dtypes, token count, token ids, finite values, checksum."""
    check_header(path, num_tokens=num_tokens, num_aux=num_aux, hidden_size=hidden_size, dtype=dtype)
    data = Path(path).read_bytes()
    rec = record_of(data)
    if crc32 is not None and rec.crc32 != crc32:
        raise SampleFormatError(f"{path}: checksum {rec.crc32}, manifest says {crc32} (corrupt)")
    s = SampleTensors(**{k: v for k, v in load(data).items() if k in KEYS})
    if input_ids is not None and not torch.equal(s.input_ids, input_ids.to(torch.int64)):
        raise SampleFormatError(f"{path}: token ids differ from the prepared sample")
    for key in ("aux_hidden_states", "last_hidden_state"):
        if not torch.isfinite(getattr(s, key)).all():
            raise SampleFormatError(f"{path}: {key} has non-finite values")
    return rec
