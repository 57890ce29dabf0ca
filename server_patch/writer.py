"""The background writer: turns a finished request's chunks into one store-format file.

The forward thread only slices and copies (device -> CPU) and hands the chunks over; encoding,
fsync and rename happen here, in one daemon thread fed by a bounded queue. A full queue blocks the
forward thread (back-pressure) rather than dropping data or growing without bound.
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from eagle3.store import dump_protocol as proto
from eagle3.store.fsio import atomic_write_bytes
from eagle3.store.sample_format import FP8, FP8_NAME, encode_sample, quantize_fp8

log = logging.getLogger("eagle3.server_patch")


@dataclass
class Chunk:
    aux: torch.Tensor  # [n, K*H] on CPU (pinned when the model runs on CUDA); float8_e4m3fn when quantized
    last: torch.Tensor  # [n, H]
    ready: Any  # a torch.cuda.Event to wait on before reading, or None
    aux_scales: torch.Tensor | None = None  # [n, K] float32 when quantized (on the device, by the hook)
    last_scale: torch.Tensor | None = None  # [n]

    STATES = ("aux", "last", "aux_scales", "last_scale")


@dataclass
class Job:
    rid: str
    input_ids: list[int]  # the prompt the server saw
    chunks: list[Chunk]
    layers: list[int]  # what SGLang captures (internal indices = HF hidden_states indices)


def _cat(parts: list[torch.Tensor | None]) -> torch.Tensor | None:
    """The chunks of one state in prompt order (None when the chunks carry none, e.g. no scales)."""
    if any(p is None for p in parts):
        return None
    return torch.cat(parts) if len(parts) > 1 else parts[0]  # type: ignore[arg-type,return-value]


class DumpWriter:
    def __init__(self, dump_dir: Path, depth: int = 8):
        self.dump_dir = Path(dump_dir)
        self._q: queue.Queue[Job | None] = queue.Queue(maxsize=max(1, depth))
        self._thread = threading.Thread(target=self._run, name="eagle3-dump-writer", daemon=True)
        self._thread.start()
        self.written = 0
        self.failed = 0

    def submit(self, job: Job) -> None:
        self._q.put(job)

    def error(self, rid: str, reason: str) -> None:
        log.warning("eagle3 dump %s failed: %s", rid, reason)
        self.failed += 1
        try:
            proto.write_error(self.dump_dir, rid, reason)
        except OSError:
            log.exception("cannot write the error file for %s", rid)

    def close(self, timeout: float = 60.0) -> None:
        self._q.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            job = self._q.get()
            if job is None:
                return
            try:
                self._write(job)
            except Exception as e:  # one bad request must not stop the writer
                log.exception("eagle3 dump %s", job.rid)
                self.error(job.rid, f"writer failed: {type(e).__name__}: {e}")

    def _write(self, job: Job) -> None:
        try:
            req = proto.read_request(self.dump_dir, job.rid)
        except FileNotFoundError:
            self.error(
                job.rid, f"no request file {proto.request_path(self.dump_dir, job.rid).name} (loss mask, sample id)"
            )
            return
        if req.num_tokens != len(job.input_ids):
            self.error(
                job.rid, f"server saw {len(job.input_ids)} prompt tokens, the request file says {req.num_tokens}"
            )
            return
        if req.aux_layers != job.layers:
            self.error(job.rid, f"server captures HF layers {job.layers}, the request file asks for {req.aux_layers}")
            return
        k = len(job.layers)
        for c in job.chunks:
            if c.ready is not None:
                c.ready.synchronize()
        aux, last, aux_scales, last_scale = (_cat([getattr(c, f) for c in job.chunks]) for f in Chunk.STATES)
        assert aux is not None and last is not None
        t, h = last.shape  # [T, H]
        if aux.shape != (t, k * h) or t != req.num_tokens:
            self.error(
                job.rid,
                f"rows do not add up: aux {tuple(aux.shape)}, last {tuple(last.shape)}, {req.num_tokens} tokens",
            )
            return
        aux = aux.view(t, k, h)  # [T, K, H]: SGLang concatenates the K layers on the last dim
        quantized = aux.dtype == FP8
        if quantized != (req.store_dtype == FP8_NAME):
            if quantized:
                self.error(job.rid, f"the hook quantized to FP8, the request file asks for {req.store_dtype}")
                return
            # The request file was unreadable when the first chunk came: quantize here, on the CPU (one pass).
            (aux, aux_scales), (last, last_scale) = quantize_fp8(aux), quantize_fp8(last)
        data = encode_sample(
            req.sample_id,
            req.aux_layers,
            torch.tensor(job.input_ids, dtype=torch.int64),
            torch.tensor(req.loss_mask, dtype=torch.uint8),
            aux,
            last,
            aux_scales,
            last_scale,
        )
        atomic_write_bytes(proto.dump_path(self.dump_dir, job.rid), data)
        self.written += 1
