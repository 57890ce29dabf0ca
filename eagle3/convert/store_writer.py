"""Write an imported peer dataset as a normal store: sample files, shard manifests, prepared shards, run.json.

The importers (specforge.py, speculators.py) only say how to load one peer sample; this module owns the
store side, through RunStore, sample_format and fsio like every other writer. run.json and import.json
are written last, so an import that fails part-way leaves no run.json (delete the directory and retry).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from eagle3.config import PipelineConfig
from eagle3.convert.common import DTYPE_NAMES, PeerFormatError, TargetModel, ordered_map
from eagle3.progress import ProgressCounter, ProgressFn
from eagle3.store.fsio import atomic_write_json
from eagle3.store.run_store import PREPARED_SCHEMA, PreparedManifest, RunInfo, RunStore, SampleEntry, ShardManifest
from eagle3.store.sample_format import FP8_NAME, encode_sample, quantize_fp8, write_sample


@dataclass
class PeerJob:
    """One peer sample to import: its file, its index in the peer dataset, the sample id it gets."""

    index: int
    path: Path
    sample_id: str
    input_ids: torch.Tensor | None = None  # speculators keeps ids and masks in its Arrow dataset
    loss_mask: torch.Tensor | None = None
    num_tokens: int | None = None  # known from our sidecar: checked after loading


@dataclass
class PeerSample:
    """One peer sample converted to the store's tensors (unpadded)."""

    sample_id: str
    source: str  # the peer file, as the error messages name it
    input_ids: torch.Tensor  # [T] int64
    loss_mask: torch.Tensor  # [T] uint8
    aux_hidden_states: torch.Tensor  # [T, K, H]
    last_hidden_state: torch.Tensor  # [T, H]
    trimmed: int = 0  # padding rows removed


@dataclass
class StoreSummary:
    hidden_size: int = 0
    dtype: str = ""
    num_samples: int = 0
    num_tokens: int = 0
    num_loss_tokens: int = 0
    trimmed_rows: int = 0
    shard_samples: list[int] = field(default_factory=list)
    shard_tokens: list[int] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    crcs: list[str] = field(default_factory=list)

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256("\n".join(self.crcs).encode()).hexdigest()


def require_empty(store: RunStore) -> None:
    if store.root.exists() and any(store.root.iterdir()):
        raise PeerFormatError(
            f"{store.root} is not empty; an import writes a new store: choose a new run_dir or delete this one"
        )


def _prepared_table(rows: list[PeerSample]) -> pa.Table:
    lengths = np.array([r.input_ids.numel() for r in rows], dtype=np.int32)
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    ids = np.concatenate([r.input_ids.numpy() for r in rows]).astype(np.int32) if rows else np.zeros(0, np.int32)
    mask = np.concatenate([r.loss_mask.numpy() for r in rows]) if rows else np.zeros(0, np.uint8)
    return pa.table(
        {
            "sample_id": [r.sample_id for r in rows],
            "input_ids": pa.ListArray.from_arrays(offsets, pa.array(ids, pa.int32())),
            "loss_mask": pa.ListArray.from_arrays(offsets, pa.array(mask, pa.uint8())),
            "num_tokens": pa.array(lengths, pa.int32()),
            "source": [r.source for r in rows],
            "messages": ["[]"] * len(rows),  # the conversation text does not travel with peer data
        },
        schema=PREPARED_SCHEMA,
    )


def write_shards(
    store: RunStore,
    shards: Iterable[list[PeerJob]],
    load: Callable[[PeerJob], PeerSample | None],
    *,
    aux_layers: list[int],
    vocab_size: int,
    total: int,
    workers: int,
    report: ProgressFn,
    fp8: bool = False,
) -> StoreSummary:
    """Load every job (None = a skipped, missing peer file), write it into the store, shard by shard; `fp8`:
    quantize the states (an FP8 store, eagle3.store.sample_format.quantize_fp8) as extraction would."""
    summary = StoreSummary()
    counter = ProgressCounter("import", total, report)
    shape: tuple[int, int, torch.dtype] | None = None  # (K, H, dtype) of the first sample

    def one(args: tuple[int, PeerJob]) -> tuple[PeerSample, SampleEntry] | None:
        shard, job = args
        s = load(job)
        if s is None:
            return None
        if job.num_tokens is not None and s.input_ids.numel() != job.num_tokens:
            raise PeerFormatError(f"{s.source}: {s.input_ids.numel()} tokens, the export sidecar says {job.num_tokens}")
        if s.input_ids.numel() and (int(s.input_ids.min()) < 0 or int(s.input_ids.max()) >= vocab_size):
            raise PeerFormatError(f"{s.source}: token id outside the target vocabulary 0..{vocab_size - 1}")
        states: list[torch.Tensor] = [s.aux_hidden_states, s.last_hidden_state]
        if fp8:
            (qa, sa), (ql, sl) = quantize_fp8(s.aux_hidden_states), quantize_fp8(s.last_hidden_state)
            states = [qa, ql, sa, sl]
        data = encode_sample(s.sample_id, aux_layers, s.input_ids, s.loss_mask, *states)
        rec = write_sample(store.sample_path(shard, s.sample_id), data)
        return s, SampleEntry(num_tokens=rec.num_tokens, num_bytes=rec.num_bytes, crc32=rec.crc32)

    for shard, jobs in enumerate(shards):
        manifest = ShardManifest(shard=shard, status="complete", expected=0)
        rows: list[PeerSample] = []
        for job, out in zip(jobs, ordered_map(one, [(shard, j) for j in jobs], workers), strict=True):
            if out is None:
                summary.skipped.append(str(job.path))
                counter.add(1, skipped=1)
                continue
            s, entry = out
            got = (s.aux_hidden_states.shape[1], s.aux_hidden_states.shape[2], s.aux_hidden_states.dtype)
            shape = shape or got
            if got != shape or s.last_hidden_state.dtype != shape[2]:
                raise PeerFormatError(
                    f"{s.source}: (layers, hidden, dtype) {got} differ from the first sample's {shape}"
                )
            if s.sample_id in manifest.samples:
                raise PeerFormatError(f"{s.source}: duplicate sample id {s.sample_id!r} in shard {shard}")
            manifest.samples[s.sample_id] = entry
            rows.append(s)
            summary.crcs.append(entry.crc32)
            summary.num_loss_tokens += int(s.loss_mask.sum())
            summary.trimmed_rows += s.trimmed
            counter.add(1, tokens=entry.num_tokens)
        manifest.expected = len(rows)
        store.write_manifest(manifest)
        store.write_prepared_shard(shard, _prepared_table(rows))
        summary.shard_samples.append(len(rows))
        summary.shard_tokens.append(sum(r.input_ids.numel() for r in rows))
    counter.finish()
    if shape is None:
        raise PeerFormatError("no samples were imported (every peer file was missing)")
    summary.hidden_size, summary.dtype = shape[1], DTYPE_NAMES[shape[2]]
    summary.num_samples, summary.num_tokens = sum(summary.shard_samples), sum(summary.shard_tokens)
    return summary


def finish_store(
    store: RunStore,
    info: RunInfo,
    summary: StoreSummary,
    *,
    dataset: str,
    cfg: PipelineConfig,
    import_record: dict,
) -> None:
    """Prepared manifest, run.json, import.json: the store is complete once run.json exists."""
    store.write_prepared_manifest(
        PreparedManifest(
            dataset=dataset,
            dataset_fingerprint=info.dataset_fingerprint,
            tokenizer_sha256=info.tokenizer_sha256,
            num_samples=summary.num_samples,
            num_tokens=summary.num_tokens,
            num_loss_tokens=summary.num_loss_tokens,
            shards=summary.shard_samples,
            shard_tokens=summary.shard_tokens,
            config=cfg.data.model_dump(mode="json"),
        )
    )
    store.write_run_info(info)
    atomic_write_json(store.import_json, import_record)


def import_into(
    store: RunStore,
    shards: list[list[PeerJob]],
    load: Callable[[PeerJob], PeerSample | None],
    *,
    info: RunInfo | None,
    target: TargetModel | None,
    aux_layers: list[int],
    peer_ids: list[int],
    convention: str,
    engine: str,
    cfg: PipelineConfig | None,
    workers: int,
    report: ProgressFn,
) -> tuple[StoreSummary, RunInfo, PipelineConfig]:
    """Write the peer's samples, then the RunInfo (`info` when the peer carries one, else built from `target`)
    and the config the store records: the shared tail of every importer, before its own ImportResult."""
    vocab = info.vocab_size if info else target.vocab_size  # type: ignore[union-attr]
    # FP8 when the export came from an FP8 store (its sidecar's run.json), or when the config asks for it.
    fp8 = (info.store_dtype if info else cfg.extract.store_dtype if cfg else "") == FP8_NAME
    summary = write_shards(store, shards, load, aux_layers=aux_layers, vocab_size=vocab,
                           total=sum(len(s) for s in shards), workers=workers, report=report, fp8=fp8)  # fmt: skip
    if info is None:
        assert target is not None
        info = imported_run_info(target, summary.dtype, summary.hidden_size, aux_layers, peer_ids, convention,
                                 engine, summary.fingerprint, cfg, store)  # fmt: skip
        info.store_dtype = FP8_NAME if fp8 else info.dtype
    cfg = cfg or PipelineConfig.model_validate({"run_dir": str(store.root), "model": info.model_path})
    return summary, info, cfg


def peer_path(src: Path, path: Path) -> str:
    return str(path.relative_to(src)) if path.is_relative_to(src) else str(path)


def imported_run_info(
    target: TargetModel,
    dtype: str,
    hidden_size: int,
    aux_layers: list[int],
    peer_ids: list[int],
    convention: str,
    engine: str,
    fingerprint: str,
    cfg: PipelineConfig | None,
    store: RunStore,
) -> RunInfo:
    from eagle3 import __version__

    cfg = cfg or PipelineConfig.model_validate({"run_dir": str(store.root), "model": target.model_path})
    return RunInfo(
        model_path=target.model_path,
        model_sha256=target.model_sha256,
        tokenizer_sha256=target.tokenizer_sha256,
        engine=engine,
        engine_version="unknown (imported)",
        dtype=dtype,
        hidden_size=hidden_size,
        num_layers=target.num_layers,
        vocab_size=target.vocab_size,
        aux_layers=aux_layers,
        engine_layer_ids=peer_ids,
        engine_layer_convention=convention,
        dataset_fingerprint=fingerprint,
        versions={"eagle3": __version__, "torch": torch.__version__},
        config=cfg.model_dump(mode="json"),
    )
