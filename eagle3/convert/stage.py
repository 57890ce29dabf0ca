"""The convert stage: one pass over the store's token ids builds the vocab map and the training index.

    <run_dir>/vocab_map.safetensors   d2t / t2d (eagle3/convert/vocab.py)
    <run_dir>/index.arrow             per-sample lengths and locations (eagle3/convert/index.py)
    <run_dir>/convert.json            ConvertResult + the input fingerprint; written last

run.json is not touched (RunInfo forbids extra keys); coverage lives in convert.json. The stage is
skipped when convert.json's fingerprint (every manifest entry's sample id, size and checksum, the draft
and target vocabulary sizes, the format versions) matches and both outputs exist.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
from pydantic import Field

from eagle3.config import PipelineConfig
from eagle3.convert.common import ConvertError, Record, require_run_info
from eagle3.convert.index import INDEX_FORMAT, IndexRow, write_index
from eagle3.convert.vocab import VOCAB_FORMAT, select_vocab, write_vocab_map
from eagle3.progress import ProgressCounter, ProgressFn, no_progress
from eagle3.store.fsio import atomic_write_json
from eagle3.store.paths import RunPaths
from eagle3.store.run_store import RunInfo, RunStore, read_record
from eagle3.store.sample_format import SampleFormatError, check_header, read_header

CONVERT_FORMAT = "eagle3-convert/1"


class ConvertResult(Record):
    """convert.json; what the convert task returns (paths, counts, coverage)."""

    format: str = CONVERT_FORMAT
    run_dir: str
    vocab_map_path: str
    index_path: str
    fingerprint: str
    num_shards: int
    num_samples: int
    num_tokens: int
    num_loss_tokens: int
    distinct_tokens: int = Field(description="distinct loss-masked target ids")
    draft_vocab_size: int = Field(description="after capping at the target vocabulary")
    target_vocab_size: int
    coverage: float = Field(description="share of loss-masked tokens whose id is in the draft vocabulary")
    skipped: bool = Field(default=False, description="True when the outputs were already up to date")
    elapsed_s: float


@dataclass
class _ShardScan:
    counts: torch.Tensor  # int64 [V]
    rows: list[IndexRow]


def _fingerprint(store: RunStore, info: RunInfo, draft: int) -> tuple[str, int]:
    h = hashlib.sha256()
    h.update(json.dumps([CONVERT_FORMAT, VOCAB_FORMAT, INDEX_FORMAT, draft, info.vocab_size]).encode())
    n = 0
    for m in store.manifests():
        for sid, e in m.samples.items():
            h.update(f"{m.shard}\0{sid}\0{e.num_bytes}\0{e.crc32}\n".encode())
            n += 1
    return h.hexdigest(), n


def _token_arrays(path: Path, info: RunInfo) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids [T] int64 and loss_mask [T] uint8 of a sample, reading only those bytes."""
    check_header(path, num_tokens=None, num_aux=len(info.aux_layers), hidden_size=info.hidden_size,
                 dtype=info.stored)  # fmt: skip
    header, n, _ = read_header(path)
    out = []
    with open(path, "rb") as f:
        for key, dtype in (("input_ids", torch.int64), ("loss_mask", torch.uint8)):
            a, b = header[key]["data_offsets"]
            f.seek(8 + n + a)
            buf = bytearray(f.read(b - a))
            out.append(torch.frombuffer(buf, dtype=dtype) if buf else torch.empty(0, dtype=dtype))
    return out[0], out[1]


def _scan_shard(store: RunStore, info: RunInfo, shard: int, sample_ids: list[str], progress: _Counter) -> _ShardScan:
    masked: list[torch.Tensor] = []
    rows: list[IndexRow] = []
    for sid in sample_ids:
        path = store.sample_path(shard, sid)
        try:
            ids, mask = _token_arrays(path, info)
        except SampleFormatError as e:
            raise ConvertError(f"{e} (shard {shard}, sample {sid}); re-run extract for this shard") from None
        sel = ids[mask.bool()]  # [L] loss-masked target ids
        if sel.numel() and (int(sel.min()) < 0 or int(sel.max()) >= info.vocab_size):
            raise ConvertError(
                f"{path}: loss-masked token id {int(sel.max())} outside the target vocabulary 0..{info.vocab_size - 1} "
                "(run.json vocab_size); the store and the model disagree"
            )
        masked.append(sel)
        rows.append(IndexRow(shard, sid, str(path.relative_to(store.root)), int(ids.numel()), int(sel.numel())))
        progress.add(int(ids.numel()))
    all_ids = torch.cat(masked) if masked else torch.empty(0, dtype=torch.int64)
    return _ShardScan(torch.bincount(all_ids, minlength=info.vocab_size), rows)


class _Counter:
    """ProgressCounter shared by the shard threads."""

    def __init__(self, counter: ProgressCounter):
        self.counter = counter
        self.lock = threading.Lock()

    def add(self, tokens: int) -> None:
        with self.lock:
            self.counter.add(1, tokens=tokens)


def read_convert_result(store: RunPaths) -> ConvertResult | None:
    """The store's convert.json, None when convert has not run."""
    return read_record(store.convert_json, ConvertResult)


def _previous(store: RunStore, fingerprint: str) -> ConvertResult | None:
    try:
        old = read_convert_result(store)
    except Exception:
        return None
    vocab_path, index_path = store.vocab_map_path, store.index_path
    if old is None or old.fingerprint != fingerprint or not vocab_path.is_file() or not index_path.is_file():
        return None
    return old.model_copy(update={"run_dir": str(store.root), "vocab_map_path": str(vocab_path),
                                  "index_path": str(index_path)})  # fmt: skip


def convert(
    cfg: PipelineConfig, store: RunStore, report: ProgressFn = no_progress, *, workers: int = 4
) -> ConvertResult:
    """Build vocab_map.safetensors and index.arrow for the store (skipped when already up to date)."""
    start = time.monotonic()
    info = require_run_info(store)
    draft = min(cfg.train.convert_vocab_size(), info.vocab_size)
    fingerprint, num_samples = _fingerprint(store, info, draft)
    if num_samples == 0:
        raise ConvertError(f"{store.root}: no extracted samples in any shard manifest; run the extract stage first")
    old = _previous(store, fingerprint)
    if old is not None:
        report(ProgressCounter("convert", num_samples, report).snapshot())
        return old.model_copy(update={"skipped": True, "elapsed_s": time.monotonic() - start})

    shards = [(m.shard, list(m.samples)) for m in store.manifests() if m.samples]
    counter = ProgressCounter("convert", num_samples, report)
    shared = _Counter(counter)
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(shards)))) as pool:
        scans = list(pool.map(lambda s: _scan_shard(store, info, s[0], s[1], shared), shards))
    counter.finish()

    counts = torch.stack([s.counts for s in scans]).sum(0)  # [V]
    rows = [r for s in scans for r in s.rows]
    vm = select_vocab(counts, draft)
    if vm.loss_tokens == 0:
        raise ConvertError(
            f"{store.root}: no loss-masked tokens in {num_samples} samples; check the prepare stage's masks"
        )
    vocab_path, index_path = store.vocab_map_path, store.index_path
    write_vocab_map(vocab_path, vm)
    write_index(index_path, rows, fingerprint)
    result = ConvertResult(
        run_dir=str(store.root),
        vocab_map_path=str(vocab_path),
        index_path=str(index_path),
        fingerprint=fingerprint,
        num_shards=len(shards),
        num_samples=len(rows),
        num_tokens=sum(r.num_tokens for r in rows),
        num_loss_tokens=vm.loss_tokens,
        distinct_tokens=vm.distinct_tokens,
        draft_vocab_size=vm.draft_vocab_size,
        target_vocab_size=vm.target_vocab_size,
        coverage=vm.coverage,
        elapsed_s=time.monotonic() - start,
    )
    atomic_write_json(store.convert_json, result.model_dump(mode="json"))
    return result
