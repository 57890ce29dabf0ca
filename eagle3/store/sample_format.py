"""One sample of hidden states on disk: the store's file format (docs/formats.md).

A sample file is safetensors with exactly these tensors, unpadded:
    input_ids          int64  [T]
    loss_mask          uint8  [T]
    aux_hidden_states  dtype  [T, K, H]   HF hidden_states[aux_layers], stacked on dim 1
    last_hidden_state  dtype  [T, H]      final post-norm state
and `__metadata__` {"format", "sample_id", "aux_layers"}. dtype is the model's (bf16/f16/f32), or FP8:

FP8 samples (extract.store_dtype: float8_e4m3) hold both states as float8_e4m3fn ("F8_E4M3") plus
    aux_scales         float32 [T, K]     one scale per token per aux layer
    last_scale         float32 [T]        one scale per token
with x = q.float() * scale (scale = the row's absmax / 448), and `__metadata__` adds
{"store_dtype": "float8_e4m3", "scaling": ...}. `quantize_fp8` runs wherever the states are (GPU or CPU).

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

from eagle3.store.fsio import atomic_write_bytes, atomic_write_parts

FORMAT = "eagle3-sample/1"
KEYS = ("input_ids", "loss_mask", "aux_hidden_states", "last_hidden_state")
SCALE_KEYS = ("aux_scales", "last_scale")  # FP8 samples only
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite float8_e4m3fn
FP8_NAME = "float8_e4m3"  # extract.store_dtype / run.json store_dtype
SCALING = "per token per state: scale = absmax / 448 (float32), x = q * scale"
ST_DTYPES = {
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
    "I64": torch.int64,
    "U8": torch.uint8,
    "F8_E4M3": FP8,
}
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
    aux_scales: torch.Tensor | None = None  # [T, K] float32, FP8 samples only
    last_scale: torch.Tensor | None = None  # [T] float32, FP8 samples only

    @property
    def is_fp8(self) -> bool:
        return self.aux_hidden_states.dtype == FP8

    def dequantized(self, dtype: torch.dtype = torch.bfloat16) -> SampleTensors:
        """The states in `dtype` (FP8 samples: q * scale); a sample that is not FP8 is returned as it is."""
        if not self.is_fp8:
            return self
        assert self.aux_scales is not None and self.last_scale is not None
        return SampleTensors(
            self.input_ids,
            self.loss_mask,
            dequantize_fp8(self.aux_hidden_states, self.aux_scales, dtype),
            dequantize_fp8(self.last_hidden_state, self.last_scale, dtype),
        )


def quantize_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., H] -> (q float8_e4m3fn [..., H], scale float32 [...]) with x ~= q * scale, one scale per row
    (absmax / 448). Runs on x's device; a row of zeros gets the smallest positive scale. A non-finite row
    gives a non-finite scale, which `verify_sample` refuses."""
    y = x.to(torch.float32, copy=True)
    scale = y.abs().amax(dim=-1).clamp_min_(torch.finfo(torch.float32).tiny).div_(FP8_MAX)  # [...]
    y.div_(scale.unsqueeze(-1)).clamp_(-FP8_MAX, FP8_MAX)  # NaN stays NaN: caught by the scale check
    return y.to(FP8), scale


def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """q [..., H] float8_e4m3fn, scale [...] float32 -> q * scale in `dtype` (computed in float32)."""
    return (q.to(torch.float32) * scale.unsqueeze(-1)).to(dtype)


def state_keys(dtype: torch.dtype) -> tuple[str, ...]:
    """The tensors a sample of this store dtype holds."""
    return KEYS + SCALE_KEYS if dtype == FP8 else KEYS


def encode_sample(
    sample_id: str,
    aux_layers: list[int],
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    aux_hidden_states: torch.Tensor,
    last_hidden_state: torch.Tensor,
    aux_scales: torch.Tensor | None = None,
    last_scale: torch.Tensor | None = None,
) -> bytes:
    """The sample file's bytes. Built by `encode_sample_parts`, not safetensors' `save`, whose header key order
    changes from process to process: the same sample must give the same bytes (and crc32) in every process.
    FP8 states (float8_e4m3fn, from `quantize_fp8`) come with their scales."""
    return b"".join(encode_sample_parts(sample_id, aux_layers, input_ids, loss_mask, aux_hidden_states,
                                        last_hidden_state, aux_scales, last_scale))  # fmt: skip


def encode_sample_parts(
    sample_id: str,
    aux_layers: list[int],
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    aux_hidden_states: torch.Tensor,
    last_hidden_state: torch.Tensor,
    aux_scales: torch.Tensor | None = None,
    last_scale: torch.Tensor | None = None,
) -> list[bytes | memoryview]:
    """The same file as `encode_sample`, as [header, raw bytes of each tensor] with no copy of the
    tensor data, for `write_sample_parts` to stream to disk. The layout follows safetensors: data
    ordered by element size (largest first) then name, header JSON padded with spaces to 8 bytes."""
    tensors = _sample_tensors(
        sample_id, aux_layers, input_ids, loss_mask, aux_hidden_states, last_hidden_state, aux_scales, last_scale
    )
    header: dict = {"__metadata__": _metadata(sample_id, aux_layers, fp8="aux_scales" in tensors)}
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


def _metadata(sample_id: str, aux_layers: list[int], fp8: bool = False) -> dict[str, str]:
    meta = {"format": FORMAT, "sample_id": sample_id, "aux_layers": ",".join(map(str, aux_layers))}
    if fp8:
        meta.update(store_dtype=FP8_NAME, scaling=SCALING)
    return meta


def _sample_tensors(
    sample_id: str,
    aux_layers: list[int],
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    aux_hidden_states: torch.Tensor,
    last_hidden_state: torch.Tensor,
    aux_scales: torch.Tensor | None = None,
    last_scale: torch.Tensor | None = None,
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
    out = {
        "input_ids": input_ids.to(torch.int64).contiguous(),
        "loss_mask": loss_mask.to(torch.uint8).contiguous(),
        "aux_hidden_states": aux_hidden_states.contiguous(),
        "last_hidden_state": last_hidden_state.contiguous(),
    }
    fp8 = aux_hidden_states.dtype == FP8
    if fp8 != (last_hidden_state.dtype == FP8) or fp8 != (aux_scales is not None) or fp8 != (last_scale is not None):
        raise SampleFormatError(
            f"sample {sample_id}: states {aux_hidden_states.dtype}/{last_hidden_state.dtype} with scales "
            f"{'given' if aux_scales is not None else 'absent'}/{'given' if last_scale is not None else 'absent'}; "
            "FP8 states need both scales (eagle3.store.sample_format.quantize_fp8), other dtypes none"
        )
    if aux_scales is not None and last_scale is not None:
        k = aux_hidden_states.shape[1]
        if aux_scales.shape != (t, k) or last_scale.shape != (t,):
            raise SampleFormatError(
                f"sample {sample_id}: scales aux {tuple(aux_scales.shape)}, last {tuple(last_scale.shape)}; "
                f"expected [{t}, {k}] and [{t}]"
            )
        out["aux_scales"] = aux_scales.to(torch.float32).contiguous()
        out["last_scale"] = last_scale.to(torch.float32).contiguous()
    return out


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


STATE_DTYPES = ("BF16", "F16", "F32", "F8_E4M3")  # what the hidden states may be stored as


@dataclass(frozen=True)
class SampleHeader:
    """A sample file's header, checked to be a complete sample (eagle3-sample/1) of some shape and dtype."""

    path: Path
    num_tokens: int
    dtype: torch.dtype  # of the hidden states
    entries: dict[str, tuple[str, list[int]]]  # key -> (safetensors dtype name, shape)
    offsets: dict[str, int]  # key -> absolute byte offset of its data in the file

    @property
    def keys(self) -> tuple[str, ...]:
        return state_keys(self.dtype)

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self.entries[key][1])


def parse_header(path: Path) -> SampleHeader:
    """The one check of a sample file's header (one small read; the data is not read): the format, the keys of
    its dtype, the dtypes and shapes that fit one another, and a size that ends where the last tensor does.
    Raises SampleFormatError naming the file. `check_header` adds what a store expects; `verify_sample` reads all."""
    header, n, size = read_header(path)
    meta = header.pop("__metadata__", {}) or {}
    if meta.get("format") != FORMAT:
        raise SampleFormatError(f"{path}: format {meta.get('format')!r}, expected {FORMAT!r}")
    aux_entry = header.get("aux_hidden_states")
    found = aux_entry.get("dtype") if isinstance(aux_entry, dict) else None
    if found not in STATE_DTYPES:
        raise SampleFormatError(
            f"{path}: keys {sorted(header)}, hidden states {found!r}: expected the keys {sorted(KEYS)} "
            f"(+ {list(SCALE_KEYS)} for FP8), states in {list(STATE_DTYPES)}"
        )
    dtype = ST_DTYPES[found]
    keys = state_keys(dtype)
    if set(header) != set(keys):
        raise SampleFormatError(f"{path}: keys {sorted(header)}, expected {sorted(keys)}")
    aux = header["aux_hidden_states"]["shape"]
    t = header["input_ids"]["shape"][0] if header["input_ids"]["shape"] else -1
    k, h = (aux[1], aux[2]) if len(aux) == 3 else (-1, -1)
    expect = {
        "input_ids": ("I64", [t]),
        "loss_mask": ("U8", [t]),
        "aux_hidden_states": (found, [t, k, h]),
        "last_hidden_state": (found, [t, h]),
    }
    if dtype == FP8:
        expect.update(aux_scales=("F32", [t, k]), last_scale=("F32", [t]))
    for key, (dt, shape) in expect.items():
        e = header[key]
        if e["dtype"] != dt or e["shape"] != shape:
            raise SampleFormatError(f"{path}: {key} is {e['dtype']}{e['shape']}, expected {dt}{shape}")
    end = max(header[key]["data_offsets"][1] for key in keys)
    if size != 8 + n + end:
        raise SampleFormatError(
            f"{path}: not a complete sample file ({size} bytes, expected {8 + n + end}: truncated or padded)"
        )
    return SampleHeader(
        path=Path(path),
        num_tokens=int(t),
        dtype=dtype,
        entries={key: (header[key]["dtype"], list(header[key]["shape"])) for key in keys},
        offsets={key: 8 + n + header[key]["data_offsets"][0] for key in keys},
    )


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
    h = parse_header(path)
    if (h.dtype == FP8) != (dtype == FP8):  # the usual cause: a file of another store dtype
        raise SampleFormatError(
            f"{path}: hidden states are {_DTYPE_NAMES[h.dtype]}, the store holds {_DTYPE_NAMES[dtype]} "
            "(extract.store_dtype); one store holds one dtype: re-extract this sample or use a new run_dir"
        )
    t = h.num_tokens
    expect = {
        "aux_hidden_states": (_DTYPE_NAMES[dtype], [t, num_aux, hidden_size]),
        "last_hidden_state": (_DTYPE_NAMES[dtype], [t, hidden_size]),
    }
    for key, (dt, shape) in expect.items():
        if h.entries[key] != (dt, shape):
            raise SampleFormatError(f"{path}: {key} is {h.entries[key][0]}{h.entries[key][1]}, expected {dt}{shape}")
    if num_tokens is not None and t != num_tokens:
        raise SampleFormatError(f"{path}: {t} tokens, the prepared sample has {num_tokens}")
    return t


def read_sample(path: Path) -> SampleTensors:
    """Load a sample into memory (tensors own their storage)."""
    data = Path(path).read_bytes()
    try:
        t = load(data)
    except Exception as e:  # safetensors raises its own error types
        raise SampleFormatError(f"{path}: cannot be read as safetensors ({e})") from None
    return _tensors(t, path)


def _tensors(t: dict[str, torch.Tensor], path: Path) -> SampleTensors:
    missing = [k for k in KEYS if k not in t]
    if missing:
        raise SampleFormatError(f"{path}: tensors {missing} missing (keys {sorted(t)})")
    return SampleTensors(
        t["input_ids"], t["loss_mask"], t["aux_hidden_states"], t["last_hidden_state"], t.get("aux_scales"),
        t.get("last_scale"),
    )  # fmt: skip


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
    s = _tensors(load(data), path)
    if input_ids is not None and not torch.equal(s.input_ids, input_ids.to(torch.int64)):
        raise SampleFormatError(f"{path}: token ids differ from the prepared sample")
    for key in ("aux_hidden_states", "last_hidden_state"):
        x = getattr(s, key)
        if not torch.isfinite(x.to(torch.float32) if x.dtype == FP8 else x).all():
            raise SampleFormatError(f"{path}: {key} has non-finite values")
    for key in SCALE_KEYS:
        scale = getattr(s, key)
        if scale is None:
            continue
        bad = ~(torch.isfinite(scale) & (scale > 0))
        if bad.any():
            where = bad.nonzero()[0].tolist()
            raise SampleFormatError(
                f"{path}: {key} has {int(bad.sum())} scales that are not finite and positive (first at {where}: "
                f"{scale[tuple(where)].item()}); the states there cannot be dequantized: re-extract this sample"
            )
    return rec
