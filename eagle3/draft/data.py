"""Batches for the trainer: the convert stage's index and vocab map, a deterministic length-bucketed plan,
packed rows, and a background reader.

    <run_dir>/index.arrow             shard, sample_id, path (relative to run_dir), num_tokens, num_loss_tokens
    <run_dir>/vocab_map.safetensors   d2t int64 [draft], t2d bool [target vocab]

A batch is one packed row of up to `batch_tokens` tokens holding whole documents (samples), padded to
exactly `batch_tokens` so every step has one shape; attention never crosses documents (model.py masks by
document id). A sample longer than `batch_tokens` is a row of its own, whole: a longer step, padded to a multiple
of `batch_tokens` (row_tokens; few shapes for the compiled step). Not a split: the draft attends over every
position before the one it predicts, as it does in serving (its KV cache holds the whole context), and a split
would train the tokens after a cut without the context before it, at positions restarted from 0: exactly the
long-context behaviour the sample is there to teach. FlexAttention (CUDA) and the blocked dense attention (CPU)
keep the step's attention memory linear in its length (eagle3/draft/layers.py).

The plan of epoch e depends only on (seed, e): shuffle, sort windows of samples by length, fill rows first-fit in
that order, shuffle the rows. Rank r of W takes rows r, r+W, ... so resuming at a
step needs nothing but (epoch, rows consumed).

FP8 stores: a row holds the float8_e4m3fn bytes and float32 scales as read (half the bytes of bf16 from disk
and over PCIe); `PackedBatch.dequantized` turns them into bf16 on the training device.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, fields
from pathlib import Path

import pyarrow as pa
import torch
from torch import Tensor

from eagle3.convert.vocab import read_vocab_map
from eagle3.store.paths import RunPaths
from eagle3.store.sample_format import FP8, SampleFormatError, dequantize_fp8, parse_header, state_keys

SORT_WINDOW = 64  # rows' worth of samples sorted together: long enough to bucket, short enough to stay random


class DataError(ValueError):
    """The index, vocab map or a sample file is missing or inconsistent; the message names the file."""


@dataclass(frozen=True)
class Sample:
    path: Path
    num_tokens: int
    sample_id: str = ""


def load_index(run_dir: Path) -> list[Sample]:
    """Samples with at least one loss token, in index order."""
    path = RunPaths(run_dir).index_path
    if not path.is_file():
        raise DataError(f"{path} is missing; run the convert stage first")
    with pa.memory_map(str(path)) as src:
        t = pa.ipc.open_file(src).read_all()
    for col in ("sample_id", "path", "num_tokens", "num_loss_tokens"):
        if col not in t.column_names:
            raise DataError(f"{path}: column {col!r} missing (columns {t.column_names}); re-run convert")
    cols = ("sample_id", "path", "num_tokens", "num_loss_tokens")
    rows = zip(*(t[c].to_pylist() for c in cols), strict=True)
    samples = [Sample(Path(run_dir) / p, int(n), str(sid)) for sid, p, n, m in rows if m > 0 and n > 1]
    if not samples:
        raise DataError(f"{path}: no sample has loss tokens; nothing to train on")
    return samples


def load_vocab_map(run_dir: Path) -> tuple[Tensor, Tensor]:
    """(d2t int64 [draft], t2d bool [target vocab]) of the store's vocab map, checked (eagle3/convert/vocab.py)."""
    path = RunPaths(run_dir).vocab_map_path
    if not path.is_file():
        raise DataError(f"{path} is missing; run the convert stage first")
    try:
        d2t, t2d, _ = read_vocab_map(path)
    except ValueError as e:
        raise DataError(f"{e}; run the convert stage again") from None
    return d2t, t2d


def row_tokens(num_tokens: int, batch_tokens: int) -> int:
    """The length of a row holding `num_tokens` real tokens: batch_tokens, or for one sample longer than that, the
    next multiple of batch_tokens (a longer step)."""
    return max(1, -(-num_tokens // batch_tokens)) * batch_tokens


def plan_epoch(lengths: list[int], batch_tokens: int, seed: int, epoch: int) -> list[list[int]]:
    """Rows of sample indices for one epoch; a sample longer than batch_tokens gets a row of its own (whole)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    order = torch.randperm(len(lengths), generator=g).tolist()
    rows: list[list[int]] = []
    window = max(1, SORT_WINDOW * batch_tokens // max(1, sum(lengths) // len(lengths)))
    for a in range(0, len(order), window):
        open_rows: list[tuple[int, list[int]]] = []  # (tokens used, samples) of this window's rows
        for i in sorted(order[a : a + window], key=lambda i: -lengths[i]):
            n = min(lengths[i], batch_tokens)
            for j, (used, row) in enumerate(open_rows):
                if used + n <= batch_tokens:
                    open_rows[j] = (used + n, [*row, i])
                    break
            else:
                open_rows.append((n, [i]))
        rows.extend(row for _, row in open_rows)
    perm = torch.randperm(len(rows), generator=g).tolist()
    return [rows[p] for p in perm]


@dataclass
class PackedBatch:
    input_ids: Tensor  # [N] int64
    loss_mask: Tensor  # [N] uint8
    aux_hidden: Tensor  # [N, K, H] store dtype (float8_e4m3fn until `dequantized`)
    last_hidden: Tensor  # [N, H] store dtype
    positions: Tensor  # [N] int64, position within the document
    remaining: Tensor  # [N] int64, tokens after this one in its document (0 on padding)
    doc: Tensor  # [N] int32, document index in the row; padding is one more document
    num_tokens: int  # real (unpadded) tokens
    aux_scales: Tensor | None = None  # [N, K] float32, FP8 stores only (0 on padding)
    last_scale: Tensor | None = None  # [N] float32

    def dequantized(self, dtype: torch.dtype = torch.bfloat16) -> PackedBatch:
        """The states in `dtype` where they are (q * scale, on the GPU after the copy); a row that is not FP8
        is returned as it is."""
        if self.aux_scales is None or self.last_scale is None:
            return self
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        moved.update(
            aux_hidden=dequantize_fp8(self.aux_hidden, self.aux_scales, dtype),
            last_hidden=dequantize_fp8(self.last_hidden, self.last_scale, dtype),
            aux_scales=None,
            last_scale=None,
        )
        return PackedBatch(**moved)

    def to(self, device: torch.device, non_blocking: bool = False) -> PackedBatch:
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        for k, v in moved.items():
            if isinstance(v, Tensor):
                moved[k] = v.to(device, non_blocking=non_blocking)
        return PackedBatch(**moved)

    def record_stream(self, stream: torch.cuda.Stream) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, Tensor):
                v.record_stream(stream)


@dataclass(frozen=True)
class SampleLayout:
    """Where a sample file's tensors lie: absolute byte offset of each tensor's data, and its shape."""

    path: Path
    num_tokens: int
    dtype: torch.dtype  # of the hidden states
    shapes: dict[str, tuple[int, ...]]
    offsets: dict[str, int]

    @property
    def keys(self) -> tuple[str, ...]:
        return state_keys(self.dtype)


def read_layout(path: Path) -> SampleLayout:
    """The header of a sample file (one small read), checked by eagle3/store/sample_format.py's parse_header."""
    try:
        h = parse_header(path)
    except SampleFormatError as e:
        text = str(e)
        raise DataError(text if "re-run extract" in text else f"{text}; re-run extract for this sample") from None
    return SampleLayout(path, h.num_tokens, h.dtype, {k: h.shape(k) for k in h.keys}, h.offsets)


def _pread_into(fd: int, offset: int, dst: Tensor, where: Path) -> None:
    """Fill the contiguous CPU tensor `dst` with the file's bytes at `offset`. os.preadv releases the GIL for
    the read (and its page faults), so loader threads never stall the training loop's host work."""
    view = dst.view(-1).view(torch.uint8).numpy().data
    done = 0
    while done < len(view):
        got = os.preadv(fd, [view[done:]], offset + done)
        if got <= 0:
            raise DataError(f"{where}: file ended after {done} of {len(view)} bytes at offset {offset}; re-run extract")
        done += got


def read_row(paths: list[Path], batch_tokens: int, pin: bool = False, layers: list[int] | None = None) -> PackedBatch:
    """The samples at `paths` packed into one row of exactly batch_tokens tokens (one sample longer than that: a row
    of row_tokens, the sample whole), read straight from the files into the row's (pinned) buffers: no
    intermediate copy. FP8 samples stay FP8 (with their scales) here; `PackedBatch.dequantized` converts them on
    the device. `layers`: positions in the store's aux layers to keep (a draft that reads a subset of them), in
    that order; None: all."""
    layouts = [read_layout(p) for p in paths]
    counts = [lay.num_tokens for lay in layouts]
    n = sum(counts)
    if n > batch_tokens and len(paths) > 1:
        raise DataError(f"{n} tokens of {len(paths)} samples do not fit in train.batch_tokens={batch_tokens}")
    batch_tokens = row_tokens(n, batch_tokens)
    _, k, h = layouts[0].shapes["aux_hidden_states"]
    dtype = layouts[0].dtype
    for lay in layouts[1:]:
        if lay.shapes["aux_hidden_states"][1:] != (k, h) or lay.dtype != dtype:
            raise DataError(
                f"{lay.path}: hidden states {lay.dtype}{list(lay.shapes['aux_hidden_states'][1:])}, but "
                f"{layouts[0].path} has {dtype}{[k, h]}; one run holds one model's states"
            )
    out = PackedBatch(
        input_ids=torch.zeros(batch_tokens, dtype=torch.int64, pin_memory=pin),
        loss_mask=torch.zeros(batch_tokens, dtype=torch.uint8, pin_memory=pin),
        aux_hidden=torch.empty(batch_tokens, k, h, dtype=dtype, pin_memory=pin),
        last_hidden=torch.empty(batch_tokens, h, dtype=dtype, pin_memory=pin),
        positions=torch.zeros(batch_tokens, dtype=torch.int64, pin_memory=pin),
        remaining=torch.zeros(batch_tokens, dtype=torch.int64, pin_memory=pin),
        doc=torch.full((batch_tokens,), len(paths), dtype=torch.int32, pin_memory=pin),
        num_tokens=n,
    )
    dst = {
        "input_ids": out.input_ids,
        "loss_mask": out.loss_mask,
        "aux_hidden_states": out.aux_hidden,
        "last_hidden_state": out.last_hidden,
    }
    if dtype == FP8:
        out.aux_scales = torch.empty(batch_tokens, k, dtype=torch.float32, pin_memory=pin)
        out.last_scale = torch.empty(batch_tokens, dtype=torch.float32, pin_memory=pin)
        dst.update(aux_scales=out.aux_scales, last_scale=out.last_scale)
    a = 0
    for d, (lay, t) in enumerate(zip(layouts, counts, strict=True)):
        try:
            fd = os.open(lay.path, os.O_RDONLY)
        except OSError as e:
            raise DataError(f"{lay.path}: cannot read sample ({e})") from None
        try:
            for key in lay.keys:  # row-major [T, ...]: the first t rows are the first bytes
                _pread_into(fd, lay.offsets[key], dst[key][a : a + t], lay.path)
        finally:
            os.close(fd)
        out.positions[a : a + t] = torch.arange(t)
        out.remaining[a : a + t] = torch.arange(t - 1, -1, -1)
        out.doc[a : a + t] = d
        a += t
    for pad in (out.aux_hidden, out.last_hidden, out.aux_scales, out.last_scale):
        if pad is not None:
            pad[a:].view(torch.uint8).zero_()  # bytes: float8 tensors have no fill kernel on every device
    if layers is not None and layers != list(range(k)):
        pick = torch.tensor(layers)
        out.aux_hidden = _pinned(out.aux_hidden.index_select(1, pick), pin)  # [N, K', H]
        if out.aux_scales is not None:
            out.aux_scales = _pinned(out.aux_scales.index_select(1, pick), pin)  # [N, K']
    return out


def _pinned(x: Tensor, pin: bool) -> Tensor:
    return x.pin_memory() if pin else x


@dataclass(frozen=True)
class DataPosition:
    epoch: int
    rows: int  # rows of this epoch's plan consumed by all ranks together


class BatchStream:
    """Rank `rank`'s batches from `start` on, read and packed by background threads, copied to the device one
    step ahead on a side stream. Iterating yields (position after this batch, batch on the device)."""

    def __init__(
        self,
        samples: list[Sample],
        *,
        batch_tokens: int,
        seed: int,
        rank: int,
        world: int,
        device: torch.device,
        threads: int,
        prefetch: int,
        layers: list[int] | None = None,
    ) -> None:
        self.samples, self.batch_tokens, self.seed, self.layers = samples, batch_tokens, seed, layers
        self.rank, self.world, self.device = rank, world, device
        self.prefetch = prefetch
        self.lengths = [s.num_tokens for s in samples]
        self._plans: dict[int, list[list[int]]] = {}
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="eagle3-data")
        self._lock = threading.Lock()
        self.wait_s = 0.0  # time the training loop spent waiting for data

    def plan(self, epoch: int) -> list[list[int]]:
        with self._lock:
            if epoch not in self._plans:
                self._plans = {epoch: plan_epoch(self.lengths, self.batch_tokens, self.seed, epoch)}
            return self._plans[epoch]

    def steps_per_epoch(self, epoch: int = 0) -> int:
        return len(self.plan(epoch)) // self.world

    def _load(self, row: list[int]) -> PackedBatch:
        paths = [self.samples[i].path for i in row]
        return read_row(paths, self.batch_tokens, pin=self.device.type == "cuda", layers=self.layers)

    def _rows(self, start: DataPosition) -> Iterator[tuple[DataPosition, list[int]]]:
        epoch, rows = start.epoch, start.rows - start.rows % self.world
        while True:
            plan = self.plan(epoch)
            usable = len(plan) - len(plan) % self.world
            if usable == 0:
                raise DataError(
                    f"epoch {epoch} packs into {len(plan)} rows of train.batch_tokens={self.batch_tokens}, fewer "
                    f"than the {self.world} processes; lower train.batch_tokens or train.nproc, or add data"
                )
            if rows >= usable:
                epoch, rows = epoch + 1, 0
                continue
            yield DataPosition(epoch, rows + self.world), plan[rows + self.rank]
            rows += self.world

    def iterate(self, start: DataPosition) -> Iterator[tuple[DataPosition, PackedBatch]]:
        pending: deque[tuple[DataPosition, Future[PackedBatch]]] = deque()
        rows = self._rows(start)
        cuda = self.device.type == "cuda"
        copy_stream = torch.cuda.Stream(self.device) if cuda else None
        ahead: tuple[DataPosition, PackedBatch] | None = None
        while True:
            while len(pending) < self.prefetch:
                pos, row = next(rows)
                pending.append((pos, self._pool.submit(self._load, row)))
            pos, fut = pending.popleft()
            t0 = time.perf_counter()
            cpu = fut.result()
            self.wait_s += time.perf_counter() - t0
            if copy_stream is None:
                yield pos, cpu.to(self.device).dequantized()
                continue
            with torch.cuda.stream(copy_stream):  # FP8: the copy moves the FP8 bytes, dequantized on the GPU
                dev = cpu.to(self.device, non_blocking=True).dequantized()
            if ahead is not None:
                yield ahead
            torch.cuda.current_stream(self.device).wait_stream(copy_stream)
            dev.record_stream(torch.cuda.current_stream(self.device))
            ahead = (pos, dev)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
