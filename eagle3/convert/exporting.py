"""The bookkeeping both exporters share: the sample order, the sidecar, resuming, the result."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from eagle3.convert.common import (
    SIDECAR,
    ExportSidecar,
    PeerExportResult,
    PeerFormatError,
    SidecarSample,
    read_sidecar,
)
from eagle3.convert.store_writer import PeerJob
from eagle3.store.fsio import atomic_write_json
from eagle3.store.run_store import RunInfo, RunStore
from eagle3.store.sample_format import FP8_NAME


def store_samples(store: RunStore) -> list[SidecarSample]:
    """Every sample in a manifest, in store order; its position is its index in the peer layout."""
    out: list[SidecarSample] = []
    for m in store.manifests():
        for sid, e in m.samples.items():
            out.append(SidecarSample(index=len(out), shard=m.shard, sample_id=sid, num_tokens=e.num_tokens))
    return out


def begin_export(
    store: RunStore, info: RunInfo, out: Path, peer: str, peer_ids: list[int], convention: str,
    last_state: str = "post_norm",
) -> tuple[list[SidecarSample], bool]:  # fmt: skip
    """The samples to export, and whether `out` holds an interrupted export of this store (skip finished files).

    The sidecar is written first: it fixes the index -> sample mapping before any data file exists.
    """
    samples = store_samples(store)
    if not samples:
        raise PeerFormatError(f"{store.root}: no extracted samples to export; run the extract stage first")
    side = ExportSidecar(peer=peer, run_info=info.model_dump(mode="json"), aux_layers=info.aux_layers,  # type: ignore[arg-type]
                         peer_layer_ids=peer_ids, peer_layer_convention=convention, last_state=last_state,  # type: ignore[arg-type]
                         samples=samples)  # fmt: skip
    if out.exists() and any(out.iterdir()):
        old = read_sidecar(out, peer)
        if old is not None and (old.samples, old.run_info, old.last_state) == (side.samples, side.run_info, last_state):
            for tmp in out.rglob(".*.tmp"):  # left by the interrupted writer (fsio's temporary names)
                if tmp.is_file():
                    tmp.unlink()
            return samples, True
        raise PeerFormatError(
            f"{out} is not empty and is not an unfinished {peer} export of {store.root}; choose a new directory"
        )
    atomic_write_json(out / SIDECAR, side.model_dump(mode="json"))
    return samples, False


def finish_export(
    peer: str, out: Path, jobs: list[SidecarSample], totals: list[int], start: float, peer_ids: list[int],
    notes: list[str],
) -> PeerExportResult:  # fmt: skip
    return PeerExportResult(
        peer=peer,
        out_dir=str(out),
        num_samples=len(jobs),
        num_tokens=sum(j.num_tokens for j in jobs),
        bytes_read=totals[0],
        bytes_written=totals[1],
        skipped=totals[2],
        elapsed_s=time.monotonic() - start,
        peer_layer_ids=peer_ids,
        notes=notes,
    )


def store_dtype_notes(info: RunInfo, peer: str) -> list[str]:
    """What an export of an FP8 store did to the states (neither peer reads our FP8 layout)."""
    if info.store_dtype != FP8_NAME:
        return []
    return [
        f"the store is FP8 (float8_e4m3 with one float32 scale per token per state), a layout {peer} does not "
        f"read (speculators' reader at c05b95b takes float tensors only; SpecForge loads torch tensors as "
        f"saved): the export holds the states dequantized to {info.dtype} (q x scale), 2x the store's bytes. "
        "Importing this export back re-quantizes them (its eagle3_export.json records store_dtype)"
    ]


def sidecar_shards(side: ExportSidecar, make: Callable[[SidecarSample], PeerJob]) -> list[list[PeerJob]]:
    """The original shard structure (shard numbers kept, empty shards included)."""
    shards: list[list[PeerJob]] = [[] for _ in range(max(s.shard for s in side.samples) + 1)]
    for s in side.samples:
        shards[s.shard].append(make(s))
    return shards
