"""Extraction: run an engine over a prepared shard and put one sample file per sample into the store.

    open_run       run.json: create it, or check that this run may add to the existing store
    extract_shard  adopt finished files, run the engine on the rest, write through a bounded
                   background writer, keep the shard manifest current
    shard_is_complete  cheap check a caller can make before building (loading) an engine
    samples_on_disk    how many samples of some shards have a file now (progress of a run others write)

The sample files are the truth: each is written atomically, so a process killed at any moment
leaves only complete files, and a re-run redoes only the samples that were in flight.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from eagle3.config import ExtractConfig, PipelineConfig
from eagle3.extract.engines.base import Captured, Dumped, Engine, EngineInfo, Failed, Outcome
from eagle3.progress import ProgressCounter, ProgressFn, no_progress
from eagle3.store.fsio import move_into, remove_stale_temps
from eagle3.store.run_store import (
    DATA_MIX_KEYS,
    PreparedSample,
    RunInfo,
    RunStore,
    SampleEntry,
    ShardManifest,
    ShardStatus,
)
from eagle3.store.sample_format import (
    FP8_NAME,
    SampleFormatError,
    encode_sample_parts,
    record_of,
    verify_sample,
    write_sample_parts,
)
from eagle3.target.files import model_fingerprint, read_model_facts, tokenizer_fingerprint
from eagle3.versions import library_versions

#: extract.writer_threads' default, for callers without a config (benches, tests).
WRITER_THREADS: int = ExtractConfig.model_fields["writer_threads"].default

#: Called by the writer with the bytes about to be written; raises (eagle3.extract.disk.DiskBudgetError) to stop.
WriteGuard = Callable[[int], None]

#: run.json fields that must agree before a run may add samples to an existing store (and data.DATA_MIX_KEYS of
#: its config). The dataset itself may grow: each intake is listed in run.json (`intakes`).
RESUME_KEYS = ("model_sha256", "tokenizer_sha256", "dtype", "store_dtype", "aux_layers")


class RunMismatchError(ValueError):
    """The store was made by a different model, tokenizer, dtype, layer set or dataset."""


# run.json --------------------------------------------------------------------------------
def open_run(cfg: PipelineConfig, store: RunStore, model_dir: Path, engine_info: EngineInfo) -> RunInfo:
    """The RunInfo of this store: written on first use; on resume the existing one, after checking
    that nothing which shapes the data changed. Adds newly seen library versions and the intakes of a grown
    dataset (from prepared/manifest.json); changes nothing else."""
    new = build_run_info(cfg, store, model_dir, engine_info)
    old = store.read_run_info()
    if old is None:
        store.write_run_info(new)
        return new
    check_same_run(old, new, store)
    before = old.model_dump()
    old.versions.update({k: v for k, v in new.versions.items() if k not in old.versions})
    old.intakes, old.dataset_fingerprint = new.intakes, new.dataset_fingerprint
    if old.model_dump() != before:
        store.write_run_info(old)
    return old


def build_run_info(cfg: PipelineConfig, store: RunStore, model_dir: Path, engine_info: EngineInfo) -> RunInfo:
    prepared = store.read_prepared_manifest()
    if prepared is None:
        raise FileNotFoundError(f"{store.prepared_dir}/manifest.json missing; run the prepare stage first")
    tokenizer_sha = tokenizer_fingerprint(model_dir)
    if prepared.tokenizer_sha256 != tokenizer_sha:
        raise RunMismatchError(
            f"{store.prepared_dir}: prepared with tokenizer {prepared.tokenizer_sha256[:12]}, but {model_dir} has "
            f"tokenizer {tokenizer_sha[:12]}; re-run prepare for this model (or point `model` at the right one)"
        )
    facts = read_model_facts(model_dir)
    return RunInfo(
        model_path=str(model_dir),
        model_sha256=model_fingerprint(model_dir),
        tokenizer_sha256=tokenizer_sha,
        engine=engine_info.name,
        engine_version=engine_info.version,
        dtype=cfg.server.dtype,
        store_dtype=store_dtype_of(cfg),
        hidden_size=facts.hidden_size,
        num_layers=facts.num_layers,
        vocab_size=facts.vocab_size,
        aux_layers=list(engine_info.aux_layers),
        engine_layer_ids=list(engine_info.engine_layer_ids),
        engine_layer_convention=engine_info.engine_layer_convention,
        dataset_fingerprint=prepared.dataset_fingerprint,
        versions=library_versions(),
        config=cfg.model_dump(mode="json"),
        intakes=prepared.intakes,
        run_dir_template=cfg.run_dir_template,
    )


def store_dtype_of(cfg: PipelineConfig) -> str:
    """run.json's store_dtype for this config: float8_e4m3, or the model's dtype (extract.store_dtype: bfloat16)."""
    return FP8_NAME if cfg.extract.store_dtype == FP8_NAME else cfg.server.dtype


def check_same_run(old: RunInfo, new: RunInfo, store: RunStore) -> None:
    diffs = [f"{k}: store has {getattr(old, k)!r}, now {getattr(new, k)!r}" for k in RESUME_KEYS
             if getattr(old, k) != getattr(new, k)]  # fmt: skip
    old_data, new_data = old.config.get("data", {}), new.config.get("data", {})
    diffs += [f"data.{k}: store has {old_data[k]!r}, now {new_data.get(k)!r}" for k in DATA_MIX_KEYS
              if k in old_data and old_data[k] != new_data.get(k)]  # fmt: skip
    if not new.intakes and old.dataset_fingerprint != new.dataset_fingerprint:  # rewritten (synthesize), not grown
        diffs.append(f"dataset_fingerprint: store has {old.dataset_fingerprint!r}, now {new.dataset_fingerprint!r}")
    if diffs:
        raise RunMismatchError(
            f"{store.run_json} was written for different data:\n  " + "\n  ".join(diffs) + "\n"
            "Samples from both would be mixed. Choose a new run_dir (it may contain {date} or {model_sha}), or "
            f"delete {store.shards_dir} and {store.run_json} to start this store over."
        )


# one shard -------------------------------------------------------------------------------
def shard_is_complete(store: RunStore, shard: int, info: RunInfo) -> bool:
    """True when the manifest says complete, lists exactly the prepared samples, and every sample file is there
    with the size the manifest recorded. Reads the manifest, the prepared ids and one directory listing, opens
    no sample file: skipping the old shards of a big store costs no reads of its data (eagle3 verify checks the
    contents; extract_shard checks each file's header before it adopts it). `info`: the run (kept for callers)."""
    m = store.read_manifest_fast(shard)
    if m is None:
        return False
    if m.get("status") != "complete" or set(m["samples"]) != set(store.prepared_ids(shard)):
        return False
    sizes = store.sample_file_sizes(shard)
    return all(sizes.get(store.sample_name(sid)) == e["num_bytes"] for sid, e in m["samples"].items())


def extract_shard(
    store: RunStore,
    shard: int,
    engine: Engine,
    info: RunInfo,
    report: ProgressFn = no_progress,
    *,
    manifest_every_s: float = 30.0,
    writer_threads: int = WRITER_THREADS,
    queue_size: int = 8,
    guard: WriteGuard | None = None,
) -> ShardManifest:
    """Fill shard `shard` of the store; returns its final manifest. Finished samples are kept, so a
    complete shard costs only header checks and never calls the engine.

    `guard(nbytes)` runs before each sample is written; when it raises (a disk-budget guard) the shard
    stops: nothing half-written stays, finished samples are kept, the manifest says why."""
    check_engine_matches(engine.info, info)
    samples = store.prepared_samples(shard)
    check_unique_paths(store, shard, samples)
    remove_stale_temps(store.shard_dir(shard))
    old = store.read_manifest(shard)
    manifest = ShardManifest(shard=shard, status="running", expected=len(samples))
    todo = adopt_existing(store, shard, samples, info, old, manifest)
    progress = ProgressCounter("extract", len(samples), report, total_tokens=sum(map(len, samples)))  # ETA by tokens
    skipped_tokens = sum(map(len, samples)) - sum(map(len, todo))
    progress.add(len(samples) - len(todo), skipped=len(samples) - len(todo), settled_tokens=skipped_tokens)
    if not todo and old is not None and old.status == "complete" and old.samples.keys() == manifest.samples.keys():
        progress.finish()
        return old
    try:
        run_engine(
            store, shard, engine, info, todo, manifest, progress, manifest_every_s, writer_threads, queue_size, guard
        )
    except BaseException as e:
        manifest.status, manifest.log = "failed", f"aborted: {type(e).__name__}: {e}"
        store.write_manifest(manifest)
        raise
    for s in todo:
        if s.sample_id not in manifest.samples and s.sample_id not in manifest.errors:
            manifest.errors[s.sample_id] = f"engine {engine.info.name} returned no result for this sample"
    in_prepared_order(manifest, samples)
    manifest.status = final_status(manifest)
    store.write_manifest(manifest)
    progress.finish()
    return manifest


def in_prepared_order(manifest: ShardManifest, samples: list[PreparedSample]) -> None:
    """Samples and errors in prepared order, not in the order the writer threads finished: the manifest, and
    so the convert index, its fingerprint and the trainer's batches, are the same on every run."""
    order = {s.sample_id: i for i, s in enumerate(samples)}

    def rank(item: tuple[str, object]) -> int:
        return order.get(item[0], len(order))

    manifest.samples = dict(sorted(manifest.samples.items(), key=rank))
    manifest.errors = dict(sorted(manifest.errors.items(), key=rank))


def check_engine_matches(engine_info: EngineInfo, info: RunInfo) -> None:
    if list(engine_info.aux_layers) != list(info.aux_layers):
        raise RunMismatchError(
            f"engine {engine_info.name} captures HF layers {engine_info.aux_layers}, run.json says {info.aux_layers}; "
            "set extract.aux_layers to match the store or use a new run_dir"
        )


def check_unique_paths(store: RunStore, shard: int, samples: list[PreparedSample]) -> None:
    seen: dict[Path, str] = {}
    for s in samples:
        p = store.sample_path(shard, s.sample_id)
        if p in seen:
            raise ValueError(f"shard {shard}: sample ids {seen[p]!r} and {s.sample_id!r} map to one file name {p.name}")
        seen[p] = s.sample_id


def adopt_existing(
    store: RunStore,
    shard: int,
    samples: list[PreparedSample],
    info: RunInfo,
    old: ShardManifest | None,
    manifest: ShardManifest,
) -> list[PreparedSample]:
    """Record files that are already complete in `manifest`; return the samples still to do."""
    todo = []
    for s in samples:
        if store.existing_ok(shard, s, info) is None:
            todo.append(s)
            continue
        path = store.sample_path(shard, s.sample_id)
        entry = old.samples.get(s.sample_id) if old else None
        if entry is None or entry.num_bytes != path.stat().st_size:  # written after the last manifest
            rec = record_of(path.read_bytes())
            entry = SampleEntry(num_tokens=rec.num_tokens, num_bytes=rec.num_bytes, crc32=rec.crc32)
        manifest.samples[s.sample_id] = entry
    return todo


def final_status(m: ShardManifest) -> ShardStatus:
    if not m.errors:
        return "complete"
    return "partial" if m.samples else "failed"


def run_engine(
    store: RunStore,
    shard: int,
    engine: Engine,
    info: RunInfo,
    todo: list[PreparedSample],
    manifest: ShardManifest,
    progress: ProgressCounter,
    manifest_every_s: float,
    writer_threads: int,
    queue_size: int,
    guard: WriteGuard | None = None,
) -> None:
    """Engine outcomes -> writer threads -> manifest. The engine's next forward overlaps the writes."""
    if not todo:
        return
    writer = SampleWriter(store, shard, info, threads=writer_threads, queue_size=queue_size, guard=guard)
    last_write = time.monotonic()
    try:
        for outcome in engine.extract(todo):
            if isinstance(outcome, Failed):
                manifest.errors[outcome.sample.sample_id] = outcome.reason
                progress.add(failed=1, settled_tokens=len(outcome.sample))
            else:
                writer.submit(outcome)
            record_results(writer.results(), manifest, progress)
            if time.monotonic() - last_write >= manifest_every_s:
                store.write_manifest(manifest)
                last_write = time.monotonic()
        writer.close()
    finally:
        writer.abort()
        record_results(writer.results(), manifest, progress)


def record_results(results: list[Written], manifest: ShardManifest, progress: ProgressCounter) -> None:
    for r in results:
        if r.entry is not None:
            manifest.samples[r.sample.sample_id] = r.entry
            progress.add(tokens=r.entry.num_tokens)
        else:
            manifest.errors[r.sample.sample_id] = r.error or "unknown error"
            progress.add(failed=1, settled_tokens=len(r.sample))


# the background writer -------------------------------------------------------------------
@dataclass
class Written:
    sample: PreparedSample
    entry: SampleEntry | None
    error: str | None = None


class SampleWriter:
    """Threads that turn Captured/Dumped outcomes into store files.

    The queue is bounded (`queue_size` outcomes), so memory stays flat and the engine blocks when
    the disk is the bottleneck. A per-sample problem (a bad dump) becomes an error entry; anything
    else (disk full, an engine returning the wrong dtype) stops the writers and is raised by
    `submit` or `close` in the caller's thread.
    """

    def __init__(
        self,
        store: RunStore,
        shard: int,
        info: RunInfo,
        *,
        threads: int = 2,
        queue_size: int = 8,
        guard: WriteGuard | None = None,
    ):
        self.store, self.shard, self.info, self.guard = store, shard, info, guard
        self._todo: queue.Queue[Outcome | None] = queue.Queue(maxsize=queue_size)
        self._done: queue.Queue[Written] = queue.Queue()
        self._error: BaseException | None = None
        self._threads = [threading.Thread(target=self._work, daemon=True, name=f"writer-{i}") for i in range(threads)]
        for t in self._threads:
            t.start()

    def submit(self, outcome: Captured | Dumped) -> None:
        while True:
            self._raise_if_failed()
            try:
                self._todo.put(outcome, timeout=0.5)
                return
            except queue.Full:
                continue

    def results(self) -> list[Written]:
        out = []
        while True:
            try:
                out.append(self._done.get_nowait())
            except queue.Empty:
                return out

    def close(self) -> None:
        """Wait for every submitted outcome to be written; raise the first writer error."""
        for _ in self._threads:
            self.submit_stop()
        for t in self._threads:
            t.join()
        self._raise_if_failed()

    def abort(self) -> None:
        """Stop without waiting for queued outcomes (their samples are simply redone next time)."""
        if not any(t.is_alive() for t in self._threads):
            return
        self._error = self._error or RuntimeError("writer aborted")
        while True:
            try:
                self._todo.get_nowait()
            except queue.Empty:
                break
        for _ in self._threads:
            self._todo.put(None)
        for t in self._threads:
            t.join()

    def submit_stop(self) -> None:
        while True:
            self._raise_if_failed()
            try:
                self._todo.put(None, timeout=0.5)
                return
            except queue.Full:
                continue

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def _work(self) -> None:
        while (item := self._todo.get()) is not None:
            if self._error is not None:
                continue  # drain after a failure; the caller raises
            try:
                self._done.put(self._materialize(item))
            except BaseException as e:
                self._error = self._error or e

    def _materialize(self, outcome: Outcome) -> Written:
        if isinstance(outcome, Captured):
            return Written(outcome.sample, write_captured(self.store, self.shard, self.info, outcome, self.guard))
        if isinstance(outcome, Dumped):
            return adopt_dump(self.store, self.shard, self.info, outcome, self.guard)
        raise TypeError(f"writer got {type(outcome).__name__}; expected Captured or Dumped")


def write_captured(
    store: RunStore, shard: int, info: RunInfo, c: Captured, guard: WriteGuard | None = None
) -> SampleEntry:
    s = c.sample
    t, k, h = len(s), len(info.aux_layers), info.hidden_size
    dtype = info.stored
    aux, last = c.aux_hidden_states, c.last_hidden_state  # [T, K, H], [T, H]
    if aux.shape != (t, k, h) or last.shape != (t, h) or aux.dtype != dtype or last.dtype != dtype:
        raise SampleFormatError(
            f"sample {s.sample_id}: engine returned aux {aux.dtype}{tuple(aux.shape)}, last {last.dtype}"
            f"{tuple(last.shape)}; run.json expects {dtype}[{t}, {k}, {h}] and [{t}, {h}]"
        )
    ids = torch.tensor(s.input_ids, dtype=torch.int64)  # [T]
    mask = torch.tensor(s.loss_mask, dtype=torch.uint8)  # [T]
    parts = encode_sample_parts(  # header + views, no copy
        s.sample_id, info.aux_layers, ids, mask, aux, last, c.aux_scales, c.last_scale
    )
    if guard is not None:
        guard(sum(len(p) for p in parts))
    rec = write_sample_parts(store.sample_path(shard, s.sample_id), parts, t)
    return SampleEntry(num_tokens=rec.num_tokens, num_bytes=rec.num_bytes, crc32=rec.crc32)


def adopt_dump(store: RunStore, shard: int, info: RunInfo, d: Dumped, guard: WriteGuard | None = None) -> Written:
    """Verify a file another process wrote and move it into the store; a bad one is deleted and reported."""
    s = d.sample
    try:
        rec = verify_sample(
            d.path,
            num_tokens=len(s),
            num_aux=len(info.aux_layers),
            hidden_size=info.hidden_size,
            dtype=info.stored,
            input_ids=torch.tensor(s.input_ids, dtype=torch.int64),
        )
    except SampleFormatError as e:
        d.path.unlink(missing_ok=True)
        return Written(s, None, f"engine dump rejected: {e}")
    if guard is not None:
        guard(rec.num_bytes)  # a copy when the dump directory is another filesystem; a rename otherwise
    move_into(d.path, store.sample_path(shard, s.sample_id))
    return Written(s, SampleEntry(num_tokens=rec.num_tokens, num_bytes=rec.num_bytes, crc32=rec.crc32))


def samples_on_disk(store: RunStore, shards: list[int]) -> int:
    """Samples of `shards` that have a file in the store now (complete shards counted from their manifest): a cheap
    progress view of a run that other processes are writing (a directory listing per unfinished shard)."""
    done = 0
    for shard in shards:
        m = store.read_manifest(shard)
        if m is not None and m.status == "complete":
            done += len(m.samples)
        elif store.shard_dir(shard).is_dir():
            done += sum(1 for _ in store.shard_dir(shard).glob("*.safetensors"))
    return done
