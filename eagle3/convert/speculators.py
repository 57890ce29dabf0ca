"""speculators' (vLLM's) offline layout, both ways.

What speculators' current reader expects (speculators/train/data.py ArrowDataset, hs_connectors FileTransfer;
writers: scripts/prepare_data.py, scripts/data_generation_offline.py, vLLM's ExampleHiddenStatesConnector):

    <dir>/                                   `datasets` save_to_disk, format "torch"; read with load_from_disk
        input_ids  list<int64>, loss_mask list<int64>, seq_len int64      (row i = sample i)
    <dir>/hidden_states/hs_{i}.safetensors   token_ids int64 [T]; hidden_states dtype [T, L, H]
    <dir>/d2t.npy, <dir>/t2d.npy             optional vocab map (int64 / bool), found there by scripts/train.py

`hidden_states[:, :-1]` are the aux layers (vLLM ids, input of layer k = HF index k) and
`hidden_states[:, -1]` is vLLM id N: the last decoder layer's output BEFORE the final norm; speculators
applies the verifier's norm to it before the lm_head. The data carries no layer ids (they are the
`eagle_aux_hidden_state_layer_ids` given to vLLM, default [2, N//2, N-3, N]).

Our store keeps the post-norm final state, not the pre-norm one, so an export puts the post-norm state in
the last slot (recorded in eagle3_export.json) and an import of vLLM data needs the target's final norm
(`FinalNorm`) to make the post-norm state. An export for speculators' trainer passes `final_norm`: the last slot
is then the post-norm state divided by the norm's weight (`last_state: "norm_input"`), a unit-RMS vector that
speculators' verifier norm maps back to our post-norm state, so its verifier targets are ours (to within the
norm's eps and one bf16 rounding). docs/formats.md has the consequences.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
import torch
from safetensors import safe_open

from eagle3.config import PipelineConfig
from eagle3.convert.common import (
    ImportResult,
    PeerExportResult,
    PeerFormatError,
    SidecarSample,
    TargetModel,
    hf_to_vllm,
    ordered_map,
    read_sidecar,
    read_store_sample,
    require_run_info,
    safetensors_header,
    vllm_to_hf,
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
from eagle3.target.files import weight_map
from eagle3.target.layout import LM_PREFIXES, text_config

PEER = "speculators"
CONVENTION = "vllm_input_of_layer"
_NORM_KEYS = tuple(p + "norm.weight" for p in LM_PREFIXES)


@dataclass(frozen=True)
class FinalNorm:
    """The target's final RMSNorm (Llama-style: weight * x / rms(x)), to turn vLLM's pre-norm state into ours."""

    weight: torch.Tensor  # [H]
    eps: float

    def invert(self, y: torch.Tensor) -> torch.Tensor:
        """A state whose normalisation is `y` (a post-norm state): y / weight has RMS 1 (up to eps), so apply() of
        it gives back y. Refuses a weight with zeros (their coordinates cannot be recovered)."""
        if bool((self.weight == 0).any()):
            raise PeerFormatError("the final norm weight has zeros: its post-norm state has no unit-RMS preimage")
        return (y.to(torch.float32) / self.weight.to(torch.float32)).to(y.dtype)

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """transformers' LlamaRMSNorm, in the same order of operations and dtypes (result in x's dtype)."""
        x32 = x.to(torch.float32)
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * x32.to(x.dtype)).to(x.dtype)

    @classmethod
    def from_model_dir(cls, model_dir: str | Path) -> FinalNorm:
        path = Path(model_dir)
        cfg = json.loads((path / "config.json").read_text())
        text = text_config(cfg)
        eps = text.get("rms_norm_eps")
        if eps is None:
            raise PeerFormatError(f"{path / 'config.json'}: no rms_norm_eps; pass FinalNorm(weight, eps) yourself")
        where = weight_map(path)
        key = next((k for k in _NORM_KEYS if k in where), None)
        if key is not None:
            with safe_open(str(where[key]), framework="pt") as st:
                return cls(weight=st.get_tensor(key), eps=float(eps))
        raise PeerFormatError(f"{path}: no final norm weight ({' / '.join(_NORM_KEYS)}) in *.safetensors")


def hs_path(root: Path, index: int) -> Path:
    return root / "hidden_states" / f"hs_{index}.safetensors"


# export -------------------------------------------------------------------------------------------
def _hs_file(input_ids: torch.Tensor, aux: torch.Tensor, last: torch.Tensor) -> bytearray:
    """hs_{i}.safetensors bytes: token_ids int64 [T], then hidden_states [T, K+1, H] = aux layers + last.

    token_ids come first, as safetensors orders an I64 + BF16 file (8-byte alignment first). The
    interleave is one numpy copy into the output buffer (numpy: no intra-op threads to oversubscribe).
    """
    t, k, h = aux.shape
    head, (ids_at, hs_at) = safetensors_header(
        [("token_ids", torch.int64, [t]), ("hidden_states", aux.dtype, [t, k + 1, h])]
    )
    buf = bytearray(len(head) + t * 8 + t * (k + 1) * h * aux.dtype.itemsize)
    buf[: len(head)] = head
    base = len(head)
    np.frombuffer(buf, np.int64, t, base + ids_at)[:] = input_ids.numpy()
    # bf16 has no numpy dtype: copy the bits through same-width integers
    as_int, np_int = (torch.int16, np.int16) if aux.dtype.itemsize == 2 else (torch.int32, np.int32)
    hs = np.frombuffer(buf, np_int, t * (k + 1) * h, base + hs_at).reshape(t, k + 1, h)  # [T, K+1, H]
    hs[:, :k] = aux.view(as_int).numpy()
    hs[:, k] = last.view(as_int).numpy()
    return buf


def _write_dataset(out: Path, ids: list[np.ndarray], masks: list[np.ndarray]) -> None:
    """The Arrow dataset through `datasets` itself (what load_from_disk reads), moved into place file by file."""
    import datasets
    from datasets.table import InMemoryTable
    from datasets.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    lengths = np.array([a.size for a in ids], dtype=np.int64)
    if lengths.sum() >= 2**31:
        raise PeerFormatError(f"{out}: {lengths.sum()} tokens exceed one Arrow list column (2^31); export in parts")
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    table = pa.table(
        {
            "input_ids": pa.ListArray.from_arrays(offsets, pa.array(np.concatenate(ids), pa.int64())),
            "loss_mask": pa.ListArray.from_arrays(offsets, pa.array(np.concatenate(masks), pa.int64())),
            "seq_len": pa.array(lengths, pa.int64()),
        }
    )
    ds = datasets.Dataset(InMemoryTable(table))
    ds.set_format(type="torch")  # the trainer compares tensors; save_to_disk records the format
    tmp = out / ".dataset.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    quiet = are_progress_bars_disabled()
    disable_progress_bars()
    try:
        ds.save_to_disk(str(tmp))
    finally:
        if not quiet:
            enable_progress_bars()
    names = sorted(os.listdir(tmp), key=lambda n: n == "state.json")  # state.json last: it lists the rest
    for name in names:
        os.replace(tmp / name, out / name)
    tmp.rmdir()
    fsync_dir(out)


def export_speculators(
    store: RunStore,
    out_dir: str | Path,
    *,
    include_vocab_map: bool = True,
    final_norm: FinalNorm | None = None,
    workers: int = 4,
    report: ProgressFn = no_progress,
) -> PeerExportResult:
    """Write the store in speculators' offline layout; resumes an interrupted export of the same store.

    final_norm (FinalNorm.from_model_dir(model)): write the last slot as the norm's input (post-norm / weight), for
    speculators' trainer, which normalises that slot; without it the slot is our post-norm state (data moves)."""
    start = time.monotonic()
    out = Path(out_dir)
    info = require_run_info(store)
    layer_ids = hf_to_vllm(info.aux_layers, info.num_layers)
    last_state = "post_norm" if final_norm is None else "norm_input"
    jobs, skip = begin_export(store, info, out, PEER, layer_ids, CONVENTION, last_state)
    counter = ProgressCounter("export-speculators", len(jobs), report)

    def one(job: SidecarSample) -> tuple[np.ndarray, np.ndarray, tuple[int, int, int]]:
        src = store.sample_path(job.shard, job.sample_id)
        s = read_store_sample(src, info).dequantized(DTYPES[info.dtype])  # FP8 store: q * scale
        ids, mask = s.input_ids.numpy().copy(), s.loss_mask.numpy().astype(np.int64)
        dst = hs_path(out, job.index)
        if skip and dst.is_file():
            return ids, mask, (0, 0, 1)
        last = s.last_hidden_state if final_norm is None else final_norm.invert(s.last_hidden_state)
        data = _hs_file(s.input_ids, s.aux_hidden_states, last)
        atomic_write_with(dst, lambda f: f.write(data), sync_dir=False)
        return ids, mask, (src.stat().st_size, len(data), 0)

    ids_all, masks_all, totals = [], [], [0, 0, 0]
    for job, (ids, mask, done) in zip(jobs, ordered_map(one, jobs, workers), strict=True):
        ids_all.append(ids)
        masks_all.append(mask)
        totals = [a + b for a, b in zip(totals, done, strict=True)]
        counter.add(1, tokens=job.num_tokens, skipped=done[2])
    fsync_dir(out / "hidden_states")
    _write_dataset(out, ids_all, masks_all)
    notes = [
        f"layer ids for vLLM/speculators (eagle_aux_hidden_state_layer_ids): {layer_ids}",
        "the last hidden_states slot holds the POST-norm final state (our store's); speculators applies the "
        "verifier norm to that slot again, so its verifier targets differ from vLLM-extracted data "
        "(docs/formats.md)"
        if final_norm is None
        else "the last hidden_states slot holds our post-norm state divided by the final norm's weight: "
        "speculators' verifier norm maps it back to our post-norm state (its targets are ours)",
    ]
    notes += store_dtype_notes(info, PEER)
    vocab = store.vocab_map_path
    if include_vocab_map and vocab.is_file():
        d2t, t2d, _ = read_vocab_map(vocab)
        d2t = ascending(d2t)  # their lm_head rows are lm_head[t2d]: ascending target ids (eagle3/convert/vocab.py)
        for name, arr in (("d2t.npy", d2t.numpy()), ("t2d.npy", t2d.numpy())):
            atomic_write_with(out / name, lambda f, a=arr: np.save(f, a, allow_pickle=False))  # type: ignore[misc]
    counter.finish()
    return finish_export(PEER, out, jobs, totals, start, layer_ids, notes)


# import -------------------------------------------------------------------------------------------
def read_speculators_sample(job: PeerJob, num_slots: int, norm: FinalNorm | None) -> PeerSample:
    """One hs_{i}.safetensors checked against its dataset row; `norm` turns the pre-norm last slot into ours."""
    path = job.path
    try:
        with safe_open(str(path), framework="pt") as f:
            keys = set(f.keys())
            missing = sorted({"hidden_states", "token_ids"} - keys)
            if missing:
                raise PeerFormatError(f"{path}: missing {missing} (has {sorted(keys)})")
            hs, tok = f.get_tensor("hidden_states"), f.get_tensor("token_ids")
    except PeerFormatError:
        raise
    except Exception as e:  # safetensors raises its own error types
        raise PeerFormatError(f"{path}: cannot be read as safetensors ({e})") from None
    if hs.ndim != 3 or hs.shape[1] != num_slots or hs.dtype not in DTYPES.values():
        raise PeerFormatError(f"{path}: hidden_states is {hs.dtype} {list(hs.shape)}; expected a float "
                              f"[T, {num_slots}, H] ({num_slots - 1} aux layers + the last layer)")  # fmt: skip
    assert job.input_ids is not None and job.loss_mask is not None
    if tok.ndim != 1 or not torch.equal(tok.to(torch.int64), job.input_ids):
        raise PeerFormatError(f"{path}: token_ids {list(tok.shape)} differ from row {job.index} of the dataset")
    if hs.shape[0] != tok.numel() or job.loss_mask.numel() != tok.numel():
        raise PeerFormatError(f"{path}: {hs.shape[0]} hidden-state rows, {tok.numel()} token ids, "
                              f"{job.loss_mask.numel()} loss-mask entries (row {job.index})")  # fmt: skip
    last = hs[:, -1]  # [T, H]
    return PeerSample(
        sample_id=job.sample_id,
        source=str(path),
        input_ids=tok.to(torch.int64),
        loss_mask=job.loss_mask.to(torch.uint8),
        aux_hidden_states=hs[:, :-1],  # [T, K, H]
        last_hidden_state=norm.apply(last) if norm is not None else last,
    )


def _dataset_rows(src: Path) -> list[tuple[torch.Tensor, torch.Tensor]]:
    import datasets

    try:
        ds = datasets.load_from_disk(str(src))
    except Exception as e:
        raise PeerFormatError(f"{src}: not a `datasets` save_to_disk directory ({type(e).__name__}: {e})") from None
    if not isinstance(ds, datasets.Dataset):
        raise PeerFormatError(f"{src}: holds a DatasetDict; point at one split's directory")
    missing = [c for c in ("input_ids", "loss_mask") if c not in ds.column_names]
    if missing:
        raise PeerFormatError(f"{src / 'state.json'}: dataset has columns {ds.column_names}, missing {missing}")
    rows = []
    for batch in ds.with_format("arrow").iter(batch_size=1024):
        for ids, mask in zip(batch.column("input_ids"), batch.column("loss_mask"), strict=True):
            rows.append((torch.from_numpy(ids.values.to_numpy().astype(np.int64)),
                         torch.from_numpy(mask.values.to_numpy().astype(np.int64))))  # fmt: skip
    return rows


def import_speculators(
    src_dir: str | Path,
    store: RunStore,
    *,
    target: TargetModel | None = None,
    vllm_layer_ids: list[int] | None = None,
    final_norm: FinalNorm | None = None,
    cfg: PipelineConfig | None = None,
    shard_size: int = 2000,
    on_missing: Literal["fail", "skip"] = "fail",
    workers: int = 4,
    report: ProgressFn = no_progress,
) -> ImportResult:
    """Read a speculators offline directory into a new store.

    Our own exports carry everything (eagle3_export.json). For data extracted by vLLM, pass `target`,
    `vllm_layer_ids` exactly as given to vLLM (aux ids then N, e.g. [2, N//2, N-3, N]) and `final_norm`
    (FinalNorm.from_model_dir(model)): the last slot is pre-norm and the store keeps the post-norm state.
    """
    start = time.monotonic()
    src = Path(src_dir)
    require_empty(store)
    side = read_sidecar(src, PEER)
    rows = _dataset_rows(src)
    if side is not None:
        info: RunInfo | None = RunInfo.model_validate({**side.run_info, "created_at": now()})
        aux_layers, peer_ids, norm = side.aux_layers, side.peer_layer_ids, None
        if side.last_state == "norm_input":  # exported for speculators' trainer: its last slot is the norm's input
            if final_norm is None:
                raise PeerFormatError(
                    f"{src / 'eagle3_export.json'}: last_state norm_input (exported for speculators' trainer); "
                    "pass final_norm=FinalNorm.from_model_dir(model)"
                )
            norm = final_norm
        if len(side.samples) != len(rows):
            raise PeerFormatError(f"{src}: dataset has {len(rows)} rows, {src / 'eagle3_export.json'} lists "
                                  f"{len(side.samples)} samples")  # fmt: skip
        shards = sidecar_shards(side, lambda s: PeerJob(s.index, hs_path(src, s.index), s.sample_id, *rows[s.index],
                                                        num_tokens=s.num_tokens))  # fmt: skip
    else:
        if target is None or vllm_layer_ids is None or final_norm is None:
            raise PeerFormatError(
                f"{src} has no eagle3_export.json: pass target=TargetModel(...), vllm_layer_ids (as given to vLLM, "
                "ending with N) and final_norm=FinalNorm.from_model_dir(model): the last slot is vLLM's pre-norm state"
            )
        aux_layers, peer_ids, norm = vllm_to_hf(vllm_layer_ids, target.num_layers, str(src)), vllm_layer_ids, final_norm
        info = None
        jobs = [PeerJob(i, hs_path(src, i), f"speculators-{i:08d}", *r) for i, r in enumerate(rows)]
        shards = [jobs[a : a + shard_size] for a in range(0, len(jobs), shard_size)]

    def load(job: PeerJob) -> PeerSample | None:
        if not job.path.is_file():
            if on_missing == "skip" and side is None:
                return None
            raise PeerFormatError(f"{job.path}: missing (row {job.index} of the dataset); on_missing='skip' skips it")
        s = read_speculators_sample(job, len(peer_ids), norm)
        s.source = peer_path(src, job.path)
        return s

    summary, info, cfg = import_into(
        store, shards, load, info=info, target=target, aux_layers=aux_layers, peer_ids=peer_ids,
        convention=CONVENTION, engine="vllm", cfg=cfg, workers=workers, report=report,
    )  # fmt: skip
    notes = [] if norm is None else ["last slot (vLLM id N, pre-norm) passed through the target's final norm"]
    result = ImportResult(
        peer=PEER, src_dir=str(src), run_dir=str(store.root), num_samples=summary.num_samples,
        num_tokens=summary.num_tokens, num_shards=len(summary.shard_samples), aux_layers=aux_layers,
        peer_layer_ids=peer_ids, used_sidecar=side is not None, skipped_missing=summary.skipped,
        elapsed_s=time.monotonic() - start, notes=notes,
    )  # fmt: skip
    finish_store(store, info, summary, dataset=str(src), cfg=cfg, import_record=result.model_dump(mode="json"))
    return result
