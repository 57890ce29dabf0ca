"""SpecForge's offline EAGLE-3 layout, both ways. The only module (with its tests) that touches pickle.

What SpecForge's current reader expects (specforge/runtime/data_plane/offline_reader.py,
feature_store.load_feature_file, algorithms/eagle3/data.py; writer: scripts/prepare_hidden_states.py):

    <dir>/rows_{g}-{g+2000}/data_{i}.ckpt    torch.save of a dict (or .ckpt.gz, gzip of the same)
        input_ids         int64 [T]
        loss_mask         int64 [T]
        aux_hidden_state  dtype [1, T, K*H]   the K capture layers concatenated on the last dim
        hidden_state      dtype [1, T, H]     final post-norm state (SGLang's logits-processor input)
    <dir>/vocab_mapping/vocab_mapping.pt     torch.save {"d2t", "t2d"} (optional; set model.vocab_mapping_path)

The reader walks the directory recursively for *.ckpt / *.ckpt.gz (sorted by path) and reads no layer
ids: they live in the draft config (`eagle_config.eagle_aux_hidden_state_layer_ids`, output-of-layer
ids, default [1, N//2-1, N-4]). SpecForge's writer pads each sample to its batch's longest row (token
id 0, loss 0) and keeps the padding; its reader accepts any T, so we export unpadded.

Pickle: SpecForge's files are pickles. We write them with torch.save and read them only with
`torch.load(weights_only=True)`, which refuses anything but tensors and plain containers.
"""

from __future__ import annotations

import gzip
import io
import re
import time
from pathlib import Path
from typing import Any

import torch

from eagle3.config import PipelineConfig
from eagle3.convert.common import (
    DTYPE_NAMES,
    ImportResult,
    PeerExportResult,
    PeerFormatError,
    SidecarSample,
    TargetModel,
    hf_to_specforge,
    ordered_map,
    read_sidecar,
    read_store_sample,
    require_run_info,
    specforge_to_hf,
)
from eagle3.convert.exporting import begin_export, finish_export, sidecar_shards, store_dtype_notes
from eagle3.convert.store_writer import (
    PeerJob,
    PeerSample,
    finish_store,
    import_into,
    peer_path,
    require_empty,
)
from eagle3.convert.vocab import ascending, read_vocab_map
from eagle3.progress import ProgressCounter, ProgressFn, no_progress
from eagle3.store.fsio import atomic_write_with, fsync_dir
from eagle3.store.run_store import DTYPES, RunInfo, RunStore, now

PEER = "specforge"
CONVENTION = "specforge_output_of_layer"
KEYS = ("input_ids", "loss_mask", "aux_hidden_state", "hidden_state")
_NAME = re.compile(r"^data_(\d+)\.ckpt(\.gz)?$")


def specforge_path(out_dir: Path, index: int, file_group_size: int = 2000) -> Path:
    g = index // file_group_size * file_group_size
    return out_dir / f"rows_{g}-{g + file_group_size}" / f"data_{index}.ckpt"


# export -------------------------------------------------------------------------------------------
def export_specforge(
    store: RunStore,
    out_dir: str | Path,
    *,
    file_group_size: int = 2000,
    include_vocab_map: bool = True,
    workers: int = 4,
    report: ProgressFn = no_progress,
) -> PeerExportResult:
    """Write the store as SpecForge offline features; resumes an interrupted export of the same store."""
    start = time.monotonic()
    out = Path(out_dir)
    info = require_run_info(store)
    layer_ids = hf_to_specforge(info.aux_layers)
    jobs, skip = begin_export(store, info, out, PEER, layer_ids, CONVENTION)
    counter = ProgressCounter("export-specforge", len(jobs), report)

    def one(job: SidecarSample) -> tuple[int, int, int]:
        dst = specforge_path(out, job.index, file_group_size)
        if skip and dst.is_file():
            return 0, 0, 1
        src = store.sample_path(job.shard, job.sample_id)
        s = read_store_sample(src, info).dequantized(DTYPES[info.dtype])  # FP8 store: q * scale
        t, k, h = s.aux_hidden_states.shape
        record = {
            "input_ids": s.input_ids,  # [T] int64
            "loss_mask": s.loss_mask.to(torch.int64),  # [T]
            "aux_hidden_state": s.aux_hidden_states.view(1, t, k * h),  # [1, T, K*H], same bytes
            "hidden_state": s.last_hidden_state.view(1, t, h),  # [1, T, H]
        }
        atomic_write_with(dst, lambda f: torch.save(record, f), sync_dir=False)
        return src.stat().st_size, dst.stat().st_size, 0

    totals = [0, 0, 0]
    for job, done in zip(jobs, ordered_map(one, jobs, workers), strict=True):
        totals = [a + b for a, b in zip(totals, done, strict=True)]
        counter.add(1, tokens=job.num_tokens, skipped=done[2])
    for d in sorted({specforge_path(out, j.index, file_group_size).parent for j in jobs}):
        fsync_dir(d)
    notes = [f"SpecForge reads no layer ids from the data: set the draft config's "
             f"eagle_config.eagle_aux_hidden_state_layer_ids = {layer_ids} (output-of-layer ids, "
             f"HF hidden_states {info.aux_layers}); check the family rules in docs/formats.md"]  # fmt: skip
    notes += store_dtype_notes(info, PEER)
    vocab = store.vocab_map_path
    if include_vocab_map and vocab.is_file():
        d2t, t2d, _ = read_vocab_map(vocab)
        d2t = ascending(d2t)  # their teacher rows are lm_head[t2d]: ascending target ids (eagle3/convert/vocab.py)
        atomic_write_with(out / "vocab_mapping" / "vocab_mapping.pt", lambda f: torch.save({"d2t": d2t, "t2d": t2d}, f))
        notes.append(f"our vocab map: set model.vocab_mapping_path={out / 'vocab_mapping' / 'vocab_mapping.pt'}")
    counter.finish()
    return finish_export(PEER, out, jobs, totals, start, layer_ids, notes)


# import -------------------------------------------------------------------------------------------
def load_ckpt(path: Path) -> dict[str, Any]:
    """A SpecForge feature file, through the restricted unpickler (tensors and containers only)."""
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                raw = torch.load(io.BytesIO(f.read()), weights_only=True, map_location="cpu")
        else:
            raw = torch.load(path, weights_only=True, mmap=True, map_location="cpu")
    except Exception as e:  # UnpicklingError, zip errors, truncation
        raise PeerFormatError(f"{path}: cannot be read as a SpecForge feature file ({type(e).__name__}: {e})") from None
    if not isinstance(raw, dict):
        raise PeerFormatError(f"{path}: holds a {type(raw).__name__}, expected a dict of tensors")
    return raw


def _squeeze(path: Path, key: str, t: Any, ndim: int) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise PeerFormatError(f"{path}: {key} is a {type(t).__name__}, expected a tensor")
    if t.ndim == ndim + 1 and t.shape[0] == 1:
        t = t[0]
    if t.ndim != ndim:
        raise PeerFormatError(f"{path}: {key} has shape {list(t.shape)}, expected {ndim} dims (or a leading 1)")
    return t


def read_specforge_sample(path: Path, num_aux: int, *, trim_padding: bool) -> PeerSample:
    """One SpecForge file as store tensors; `trim_padding` drops trailing rows with token 0 and loss 0."""
    raw = load_ckpt(path)
    missing = [k for k in KEYS if k not in raw]
    if missing:
        raise PeerFormatError(f"{path}: missing {missing} (has {sorted(raw)}); expected keys {list(KEYS)}")
    ids = _squeeze(path, "input_ids", raw["input_ids"], 1)
    mask = _squeeze(path, "loss_mask", raw["loss_mask"], 1)
    aux = _squeeze(path, "aux_hidden_state", raw["aux_hidden_state"], 2)  # [T, K*H]
    last = _squeeze(path, "hidden_state", raw["hidden_state"], 2)  # [T, H]
    t, h = last.shape
    if ids.shape != (t,) or mask.shape != (t,) or aux.shape[0] != t:
        raise PeerFormatError(
            f"{path}: token counts disagree: input_ids {list(ids.shape)}, loss_mask {list(mask.shape)}, "
            f"aux_hidden_state {list(aux.shape)}, hidden_state {list(last.shape)}"
        )
    if aux.shape[1] != num_aux * h:
        raise PeerFormatError(f"{path}: aux_hidden_state has {aux.shape[1]} features per token; expected "
                              f"{num_aux} layers x hidden {h} = {num_aux * h}")  # fmt: skip
    if aux.dtype not in DTYPE_NAMES or last.dtype != aux.dtype:
        raise PeerFormatError(f"{path}: hidden states are {aux.dtype}/{last.dtype}; expected one of {list(DTYPES)}")
    if ids.is_floating_point() or mask.is_floating_point() or bool(((mask != 0) & (mask != 1)).any()):
        raise PeerFormatError(f"{path}: input_ids ({ids.dtype}) and loss_mask ({mask.dtype}) must be integer 0/1 masks")
    keep = t
    if trim_padding:
        pad = (ids == 0) & (mask == 0)  # SpecForge's collator pads with zeros
        while keep > 0 and bool(pad[keep - 1]):
            keep -= 1
    return PeerSample(
        sample_id="",
        source=str(path),
        input_ids=ids[:keep].to(torch.int64),
        loss_mask=mask[:keep].to(torch.uint8),
        aux_hidden_states=aux[:keep].reshape(keep, num_aux, h),  # [T, K, H]
        last_hidden_state=last[:keep],
        trimmed=t - keep,
    )


def list_specforge_files(src: Path) -> list[tuple[int, Path]]:
    """(index, path) of every feature file: index from data_{i}, else the position in SpecForge's path order."""
    files = sorted(p for p in src.rglob("*") if p.name.endswith((".ckpt", ".ckpt.gz")) and p.is_file())
    found = [_NAME.match(p.name) for p in files]
    if all(found):
        return sorted((int(m.group(1)), p) for m, p in zip(found, files, strict=True) if m)
    return list(enumerate(files))


def import_specforge(
    src_dir: str | Path,
    store: RunStore,
    *,
    target: TargetModel | None = None,
    aux_layers_output_convention: list[int] | None = None,
    aux_layers_hf: list[int] | None = None,
    cfg: PipelineConfig | None = None,
    shard_size: int = 2000,
    trim_padding: bool = True,
    workers: int = 4,
    report: ProgressFn = no_progress,
) -> ImportResult:
    """Read a SpecForge offline directory into a new store.

    Layer ids: our own exports carry them (eagle3_export.json). Otherwise give the ids SpecForge captured
    with, `aux_layers_output_convention` (the draft config's eagle_aux_hidden_state_layer_ids; HF = id + 1),
    or `aux_layers_hf` for model families where SGLang maps ids differently (docs/formats.md).
    """
    start = time.monotonic()
    src = Path(src_dir)
    require_empty(store)
    files = list_specforge_files(src)
    if not files:
        raise PeerFormatError(f"{src}: no SpecForge feature files (rows_*/data_*.ckpt) found")
    side = read_sidecar(src, PEER)
    by_index = dict(files)
    if side is not None:
        info = RunInfo.model_validate({**side.run_info, "created_at": now()})
        aux_layers, peer_ids, trim = side.aux_layers, side.peer_layer_ids, False
        missing = [s.index for s in side.samples if s.index not in by_index]
        if missing:
            raise PeerFormatError(f"{src}: data_{missing[0]}.ckpt listed in {src / 'eagle3_export.json'} is missing "
                                  f"({len(missing)} files missing)")  # fmt: skip
        shards = sidecar_shards(
            side, lambda s: PeerJob(s.index, by_index[s.index], s.sample_id, num_tokens=s.num_tokens)
        )
    else:
        if target is None or (aux_layers_output_convention is None) == (aux_layers_hf is None):
            raise PeerFormatError(
                f"{src} has no {'eagle3_export.json'}: pass target=TargetModel(...) and exactly one of "
                "aux_layers_output_convention (SpecForge/SGLang ids) or aux_layers_hf"
            )
        aux_layers = aux_layers_hf or specforge_to_hf(aux_layers_output_convention or [])
        peer_ids = aux_layers_output_convention or hf_to_specforge(aux_layers)
        if any(not 1 <= i <= target.num_layers for i in aux_layers):
            raise PeerFormatError(f"aux layers (HF) {aux_layers} out of range 1..{target.num_layers}")
        trim = trim_padding
        jobs = [PeerJob(i, p, f"specforge-{i:08d}") for i, p in files]
        shards = [jobs[a : a + shard_size] for a in range(0, len(jobs), shard_size)]
        info = None

    def load(job: PeerJob) -> PeerSample:
        s = read_specforge_sample(job.path, len(aux_layers), trim_padding=trim)
        s.sample_id, s.source = job.sample_id, peer_path(src, job.path)
        return s

    summary, info, cfg = import_into(
        store, shards, load, info=info, target=target, aux_layers=aux_layers, peer_ids=peer_ids,
        convention=CONVENTION, engine="sglang", cfg=cfg, workers=workers, report=report,
    )  # fmt: skip
    result = ImportResult(
        peer=PEER, src_dir=str(src), run_dir=str(store.root), num_samples=summary.num_samples,
        num_tokens=summary.num_tokens, num_shards=len(summary.shard_samples), aux_layers=aux_layers,
        peer_layer_ids=peer_ids, used_sidecar=side is not None, trimmed_rows=summary.trimmed_rows,
        elapsed_s=time.monotonic() - start,
    )  # fmt: skip
    finish_store(store, info, summary, dataset=str(src), cfg=cfg, import_record=result.model_dump(mode="json"))
    return result
