"""prepare: conversations (JSONL, Parquet, save_to_disk dir; a file, a folder or a glob of them; a Hugging Face
Hub dataset; a list of such sources) -> token ids + loss mask -> prepared shards.

    rows ─► normalize (ShareGPT / OpenAI) ─► chat template + loss mask ─► dedup by sample id ─► shards

A store grows: when the dataset's folder received new files, `prepare` is an intake (`take_in`) that reads only
the files it has not seen (by sha256), appends shards for samples whose id the store does not hold, and records
the intake in prepared/manifest.json. Nothing already prepared is rewritten.

A row that cannot become a sample is a BadRow (file, row, reason): skipped and recorded in the
manifest with data.on_bad_row=skip, a PrepareError with `fail`. Rows are numbered from 0 (for JSON
lines: the line number - 1). `write_prepared` is the one tokenization path; synthesize reuses it.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from eagle3.config import DataConfig, DataSource, PipelineConfig
from eagle3.data.chat import ChatTokenizer, RowError, RowFormat, normalize_row, row_tools, sample_id
from eagle3.data.sources.common import RawRow, Rows, SourceError, SourceFile, chain_rows, data_sources, file_sha256
from eagle3.data.sources.hub import hub_fingerprint, hub_name, is_hub, read_hub
from eagle3.data.sources.local import list_source_files, read_local
from eagle3.data.sources.saved import is_saved_dataset
from eagle3.data.synthesis_key import SYNTH, check_synthesis, legacy_current
from eagle3.data.tool_calls import conversation_json
from eagle3.progress import ProgressCounter, ProgressFn, no_progress
from eagle3.store.fsio import atomic_write_bytes
from eagle3.store.run_store import DATA_MIX_KEYS, PREPARED_SCHEMA, BadRow, Intake, PreparedManifest, RunStore
from eagle3.target.files import tokenizer_fingerprint


class PrepareError(RuntimeError):
    """The dataset cannot be prepared; the message names the file, row or key and the fix."""


class DatasetUnreadableError(PrepareError):
    """The dataset itself cannot be found or read (no such file, folder, split or Hub dataset)."""


class BadRowError(PrepareError):
    """A row of the dataset is bad and `data.on_bad_row` is `fail`."""


class StoreMismatchError(PrepareError):
    """The run directory holds samples prepared from other data or settings."""


# reading: the readers of eagle3/data/sources/, picked per source ---------------------------------
def _one_local_source(data: DataConfig) -> DataSource | None:
    """The source when `data` names one local file, folder or glob (taken in file by file), else None."""
    sources = data_sources(data)
    return sources[0] if len(sources) == 1 and not is_hub(sources[0]) else None


def _unit_name(i: int, source: DataSource) -> str:
    return f"sources[{i}]:{hub_name(source) if is_hub(source) else source.dataset}"


def _source_unit(i: int, source: DataSource) -> SourceFile:
    """A Hub source, or one entry of several `data.sources`, as one unit: read whole when its fingerprint changes
    (content ids keep the samples the store holds from being added twice)."""
    if is_hub(source):
        return SourceFile(_unit_name(i, source), Path(source.dataset), 0, hub_fingerprint(source))
    h = hashlib.sha256(source.model_dump_json().encode())
    files = list_source_files(source.dataset)
    for f in files:
        h.update(f"\0{f.name}\0{f.size}\0{f.sha256}".encode())
    return SourceFile(_unit_name(i, source), Path(source.dataset), sum(f.size for f in files), h.hexdigest())


def source_files(data: DataConfig) -> list[SourceFile]:
    """What the dataset consists of now, each fingerprinted: the files of one local file, folder or glob
    (eagle3.data.sources.local), or one unit per source of a Hub dataset or a list (eagle3.data.sources.hub)."""
    try:
        if _one_local_source(data) is not None:
            return list_source_files(data.dataset)
        return [_source_unit(i, s) for i, s in enumerate(data_sources(data))]
    except SourceError as e:
        raise DatasetUnreadableError(str(e)) from None


def dataset_fingerprint(data: DataConfig, files: list[SourceFile] | None = None) -> str:
    """sha256 over the data config, the chat template file's text and the dataset files' names, sizes and
    fingerprints."""
    files = source_files(data) if files is None else files
    h = hashlib.sha256(json.dumps(data.model_dump(mode="json"), sort_keys=True).encode())
    if data.chat_template is not None and Path(data.chat_template).is_file():  # its text, not only its name
        h.update(b"\0chat_template\0" + file_sha256(Path(data.chat_template)).encode())
    for f in files:
        h.update(f"\0{f.name}\0{f.size}\0{f.sha256}".encode())
    return h.hexdigest()


def _read_source(source: DataSource) -> Rows:
    """All rows of one source (a Hub dataset or a local one), cut at its max_samples."""
    total, rows = read_hub(source) if is_hub(source) else read_local(source, None)
    if source.max_samples is not None:
        rows = itertools.islice(rows, source.max_samples)
        total = min(total, source.max_samples) if total else 0
    return total, rows


def read_rows(data: DataConfig, files: list[SourceFile] | None = None) -> Rows:
    """(number of rows, or 0 when unknown; the rows in input order) of `files` (default: all of the dataset's,
    as source_files lists them). One local source is read file by file; Hub sources and the entries of a list
    whole."""
    try:
        one = _one_local_source(data)
        if one is not None:
            return read_local(one, files)
        names = None if files is None else {f.name for f in files}
        sources = [s for i, s in enumerate(data_sources(data)) if names is None or _unit_name(i, s) in names]
        return chain_rows([_read_source(s) for s in sources])
    except SourceError as e:
        raise DatasetUnreadableError(str(e)) from None


# writing -----------------------------------------------------------------------------------------
def is_current(m: PreparedManifest | None, store: RunStore, fingerprint: str, tok_sha: str, data: DataConfig) -> bool:
    """Whether manifest m (and its shard files) was written for exactly these inputs."""
    return (
        m is not None
        and m.dataset_fingerprint == fingerprint
        and m.tokenizer_sha256 == tok_sha
        and m.config == data.model_dump(mode="json")
        and all(store.prepared_shard_path(i).is_file() for i in range(len(m.shards)))
    )


def synthesized_name(dataset: str) -> str:
    """PreparedManifest.dataset of the synthesis of `dataset` (eagle3.data.synthesize writes it)."""
    return f"{SYNTH}{dataset}"


def holds_synthesis_of(m: PreparedManifest | None, store: RunStore, source: PreparedManifest, tok_sha: str,
                       data: DataConfig) -> bool:  # fmt: skip
    """Whether prepared/ (manifest m) is synthesize's output for the source preparation `source` (its rows).
    Whether that synthesis matches the synthesize settings is synthesize's own check."""
    if m is None or m.synthesis is None or m.synthesis.source_fingerprint != source.dataset_fingerprint:
        return False
    return is_current(m, store, m.dataset_fingerprint, tok_sha, data)


class _ShardWriter:
    """Prepared shards from index `first` on (an intake appends after the store's last shard)."""

    def __init__(self, store: RunStore, shard_size: int, first: int = 0):
        self.store, self.shard_size, self.first = store, shard_size, first
        self.rows: list[dict[str, Any]] = []
        self.shards: list[int] = []
        self.shard_tokens: list[int] = []

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        if len(self.rows) >= self.shard_size:
            self.flush()

    def flush(self) -> None:
        if not self.rows:
            return
        table = pa.Table.from_pylist(self.rows, schema=PREPARED_SCHEMA)
        self.store.write_prepared_shard(self.first + len(self.shards), table)
        self.shards.append(len(self.rows))
        self.shard_tokens.append(sum(r["num_tokens"] for r in self.rows))
        self.rows = []

    def remove_stale(self) -> None:
        for p in self.store.prepared_shard_paths():
            idx = p.stem.removeprefix("shard-")
            if not idx.isdigit() or int(idx) >= self.first + len(self.shards):
                p.unlink()


@dataclass
class _Tally:
    """What one pass over rows wrote: new samples, and what it skipped."""

    bad: list[BadRow] = field(default_factory=list)
    duplicates: int = 0
    loss_tokens: int = 0
    known: set[str] = field(default_factory=set)  # rows whose sample the store already holds


def _tokenize_rows(
    rows: Iterable[RawRow],
    chat: ChatTokenizer,
    data: DataConfig,
    writer: _ShardWriter,
    counter: ProgressCounter,
    *,
    known: set[str],
    limit: int | None,
    fmt: RowFormat | None,
) -> _Tally:
    """Tokenize rows into `writer`; a sample id in `known` (already in the store) or seen before is skipped."""
    seen: set[str] = set()
    tally = _Tally()
    for raw in rows:
        if limit is not None and len(seen) >= limit:
            break
        counter.total = max(counter.total, counter.done + 1)
        try:
            if raw.error is not None:
                raise RowError(raw.error)
            assert raw.data is not None
            messages = normalize_row(raw.data, fmt or data.format)
            tools = row_tools(raw.data)
            sid = sample_id(messages, tools)
            skip = sid in known or sid in seen  # the store holds it, or this pass did: no tokenizing
            tok = None if skip else chat.tokenize(messages, data.max_length, data.truncate, tools)
        except RowError as e:
            if data.on_bad_row == "fail":
                raise BadRowError(
                    f"{raw.file}: row {raw.row}: {e}. Fix or drop the row, or set data.on_bad_row=skip "
                    "to skip bad rows and list them in prepared/manifest.json"
                ) from None
            tally.bad.append(BadRow(file=raw.file, row=raw.row, reason=str(e)))
            counter.add(1, failed=1)
            continue
        if sid in known:
            tally.known.add(sid)
            counter.add(1, skipped=1)
            continue
        if sid in seen:
            tally.duplicates += 1
            counter.add(1, skipped=1)
            continue
        assert tok is not None
        seen.add(sid)
        tally.loss_tokens += tok.num_loss_tokens
        writer.add(
            {
                "sample_id": sid,
                "input_ids": tok.input_ids,
                "loss_mask": tok.loss_mask,
                "num_tokens": len(tok.input_ids),
                "source": raw.origin or f"{raw.file}:{raw.row}",
                "messages": conversation_json(messages, tools),
            }
        )
        counter.add(1, tokens=len(tok.input_ids))
    writer.flush()
    return tally


def _progress(stage: str, total: int, limit: int | None, report: ProgressFn) -> ProgressCounter:
    return ProgressCounter(stage, min(total, limit) if total and limit else (total or limit or 0), report)


def write_prepared(
    rows: Iterable[RawRow],
    chat: ChatTokenizer,
    data: DataConfig,
    store: RunStore,
    *,
    dataset: str,
    fingerprint: str,
    tokenizer_sha256: str,
    total: int,
    report: ProgressFn = no_progress,
    stage: str = "prepare",
    fmt: RowFormat | None = None,
    files: list[SourceFile] | None = None,
    capped: bool = True,
) -> PreparedManifest:
    """Tokenize rows into prepared shards from shard 0 and write the manifest (the one tokenization path).
    `files`: the source files read (recorded as the first intake, so later intakes take in only new ones).
    `capped`: stop at data.max_samples rows; synthesize passes False (its rows are the capped source's answers,
    samples_per_prompt of each)."""
    manifest_path = store.prepared_manifest_path
    manifest_path.unlink(missing_ok=True)  # no manifest while shards are rewritten: a crash is not "done"
    limit = data.max_samples if capped else None
    counter = _progress(stage, total, limit, report)
    writer = _ShardWriter(store, data.shard_size)
    tally = _tokenize_rows(rows, chat, data, writer, counter, known=set(), limit=limit, fmt=fmt)
    writer.remove_stale()
    intakes = []
    if files is not None:
        intakes.append(_intake_record({f.name: f.sha256 for f in files}, [], writer, tally, fingerprint, vanished=0))
    manifest = PreparedManifest(
        dataset=dataset,
        dataset_fingerprint=fingerprint,
        tokenizer_sha256=tokenizer_sha256,
        num_samples=sum(writer.shards),
        num_tokens=sum(writer.shard_tokens),
        num_loss_tokens=tally.loss_tokens,
        shards=writer.shards,
        shard_tokens=writer.shard_tokens,
        bad_rows=tally.bad,
        duplicates=tally.duplicates,
        config=data.model_dump(mode="json"),
        files={f.name: f.sha256 for f in files or []},
        intakes=intakes,
    )
    store.write_prepared_manifest(manifest)
    counter.finish()
    return manifest


def _intake_record(
    files: dict[str, str], missing: list[str], writer: _ShardWriter, tally: _Tally, fingerprint: str, vanished: int
) -> Intake:
    return Intake(
        files=files,
        missing_files=missing,
        new_samples=sum(writer.shards),
        new_tokens=sum(writer.shard_tokens),
        shards=[writer.first + i for i in range(len(writer.shards))],
        known_samples=len(tally.known),
        vanished_samples=vanished,
        bad_rows=len(tally.bad),
        dataset_fingerprint=fingerprint,
    )


# growing -----------------------------------------------------------------------------------------
def mixing_differences(old: PreparedManifest, tok_sha: str, data: DataConfig) -> list[str]:
    """What differs between the store's prepared data and these inputs that would mix two kinds of samples."""
    diffs = []
    if old.tokenizer_sha256 != tok_sha:
        diffs.append(f"tokenizer_sha256 (tokenizer or chat template): store has {old.tokenizer_sha256[:12]}, "
                     f"now {tok_sha[:12]}")  # fmt: skip
    now = data.model_dump(mode="json")
    for k in DATA_MIX_KEYS:
        if k in old.config and old.config[k] != now[k]:  # a key the store predates was at its default
            diffs.append(f"data.{k}: store has {old.config.get(k)!r}, now {now[k]!r}")
    return diffs


def _can_grow(old: PreparedManifest, store: RunStore, tok_sha: str, data: DataConfig, extracted: bool) -> bool:
    """Whether an intake may append to `old`. Once samples were extracted (`extracted`: the store has run.json, or
    the store whose synthesis this source feeds has) the answer is yes or a refusal: prepared shards are never
    rewritten."""
    missing = [p for p in map(store.prepared_shard_path, range(len(old.shards))) if not p.is_file()]
    diffs = mixing_differences(old, tok_sha, data)
    if not extracted:  # nothing extracted yet: any change may simply prepare again from scratch
        return not (missing or diffs or old.config != data.model_dump(mode="json") or old.dataset.startswith(SYNTH))
    if old.dataset.startswith(SYNTH):  # synthesize owns prepared/: the source would replace the target's answers
        raise PrepareError(
            f"{store.prepared_dir} holds the target's answers (synthesize) and {store.run_json} says samples were "
            "extracted from them; the dataset's own answers would be mixed in. Keep `synthesize` in stages "
            "(prepare, synthesize, ...), or choose a new run_dir for a store of the dataset's own answers"
        )
    if missing:
        raise StoreMismatchError(
            f"{missing[0]}: prepared shard missing in a store that has extracted samples ({store.run_json}); "
            "restore it, or choose a new run_dir"
        )
    if diffs:
        raise StoreMismatchError(
            f"{store.root} holds samples prepared differently:\n  " + "\n  ".join(diffs) + "\n"
            "New samples would be mixed with these. Choose a new run_dir for the new settings (run_dir may "
            "contain {date} or {model_sha}: docs/formats.md)."
        )
    return True


def _store_sources(store: RunStore, old: PreparedManifest) -> tuple[set[str], dict[str, list[str]]]:
    """Sample ids in the store, and per source file the ids of its rows (Arrow columns only)."""
    ids: set[str] = set()
    by_file: dict[str, list[str]] = {}
    for i in range(len(old.shards)):
        t = store.read_prepared_shard(i).select(["sample_id", "source"]).to_pydict()
        ids.update(t["sample_id"])
        for sid, src in zip(t["sample_id"], t["source"], strict=True):
            by_file.setdefault(src.rsplit(":", 1)[0], []).append(sid)
    return ids, by_file


def take_in(
    cfg: PipelineConfig,
    store: RunStore,
    old: PreparedManifest,
    files: list[SourceFile],
    chat: ChatTokenizer,
    *,
    fingerprint: str,
    report: ProgressFn = no_progress,
) -> PreparedManifest:
    """An intake: tokenize the files not taken in before (new, or changed since), append the samples the store
    does not hold yet as new prepared shards, and record the intake. Existing shards are never rewritten; a
    source row that disappeared is counted (`vanished_samples`), its sample kept."""
    new = [f for f in files if old.files.get(f.name) != f.sha256]
    missing = sorted(set(old.files) - {f.name for f in files})
    if is_saved_dataset(Path(cfg.data.dataset)) and new:
        new = files  # read whole
    ids, by_file = _store_sources(store, old) if new or missing else (set(), {})
    total, rows = read_rows(cfg.data, new) if new else (0, iter(()))
    reread = {f.name for f in new if f.name in old.files} | set(missing)

    def vanished(known: set[str]) -> int:
        return sum(1 for name in reread for sid in by_file.get(name, []) if sid not in known)

    return append_prepared(
        store, old, rows, chat, cfg.data, known=ids, total=total, fingerprint=fingerprint,
        files={f.name: f.sha256 for f in new}, missing=missing, vanished=vanished, report=report,
    )  # fmt: skip


def append_prepared(
    store: RunStore,
    old: PreparedManifest,
    rows: Iterable[RawRow],
    chat: ChatTokenizer,
    data: DataConfig,
    *,
    known: set[str],
    total: int,
    fingerprint: str,
    files: dict[str, str],
    missing: list[str] | None = None,
    vanished: Callable[[set[str]], int] = lambda _: 0,
    report: ProgressFn = no_progress,
    stage: str = "prepare",
    fmt: RowFormat | None = None,
    capped: bool = True,
) -> PreparedManifest:
    """Append the rows whose sample id is not in `known` as new prepared shards after `old`'s last one and record
    the intake (`files` read, `missing` files); the manifest is written last, so a kill before it leaves the old
    manifest and the new shards unlisted. Existing shards are never rewritten (prepare's intake, synthesize).
    `capped`: as write_prepared's."""
    missing = missing or []
    limit = None if data.max_samples is None or not capped else max(0, data.max_samples - old.num_samples)
    counter = _progress(stage, total, limit, report)
    writer = _ShardWriter(store, data.shard_size, first=len(old.shards))
    tally = _tokenize_rows(rows, chat, data, writer, counter, known=known, limit=limit, fmt=fmt)
    m = old.model_copy(deep=True)
    m.dataset_fingerprint, m.config = fingerprint, data.model_dump(mode="json")
    m.num_samples += sum(writer.shards)
    m.num_tokens += sum(writer.shard_tokens)
    m.num_loss_tokens += tally.loss_tokens
    m.shards += writer.shards
    m.shard_tokens += writer.shard_tokens
    m.bad_rows += tally.bad
    m.duplicates += tally.duplicates
    m.files = {**{k: v for k, v in old.files.items() if k not in missing}, **files}
    if files or missing or writer.shards:
        m.intakes.append(_intake_record(files, missing, writer, tally, fingerprint, vanished(tally.known)))
    store.write_prepared_manifest(m)
    counter.finish()
    return m


def prepare_source(
    cfg: PipelineConfig, store: RunStore, model_dir: Path, report: ProgressFn = no_progress
) -> PreparedManifest:
    """The source that synthesize answers, prepared (or grown by an intake) in synthesized/source/: refused as
    prepare refuses once the store's samples were extracted. A first synthesize adopts the prepare stage's output
    in prepared/ (copied) instead of tokenizing again."""
    source = store.synthesis_source()
    main = store.read_prepared_manifest()
    if source.read_prepared_manifest() is None and main is not None and main.synthesis is None:
        files = source_files(cfg.data)
        if is_current(main, store, dataset_fingerprint(cfg.data, files), tokenizer_fingerprint(model_dir), cfg.data):
            for i in range(len(main.shards)):
                atomic_write_bytes(source.prepared_shard_path(i), store.prepared_shard_path(i).read_bytes())
            source.write_prepared_manifest(main)
    extracted = store.read_run_info() is not None
    return prepare(cfg, source, model_dir, report, raw=True, extracted=extracted)


def prepare(
    cfg: PipelineConfig,
    store: RunStore,
    model_dir: Path,
    report: ProgressFn = no_progress,
    *,
    raw: bool = False,
    extracted: bool | None = None,
) -> PreparedManifest:
    """Prepare cfg.data into store/prepared; returns the existing manifest when inputs are unchanged.

    A store that already holds prepared samples grows: an intake takes in only new source files (and files that
    changed) and appends new samples (eagle3.data.prepare.take_in). A tokenizer or max_length change is refused once
    samples were extracted; before that, any change prepares again from scratch.

    When the run synthesizes (cfg.stages) and prepared/ holds a synthesis, prepared/ is synthesize's: the source
    is prepared (grown) in synthesized/source/ instead, and the synthesis is returned when it answers exactly
    that source (else the source's manifest: synthesize answers what is new). A synthesize setting the store's
    extracted samples were not made with is refused here, before anything is written. `raw`: the source's own
    preparation in this store in any case. `extracted`: whether samples were extracted from this store (None:
    whether it has run.json)."""
    if not raw and "synthesize" in cfg.stages:
        existing = store.read_prepared_manifest()
        legacy = existing is not None and existing.synthesis is None and existing.dataset.startswith(SYNTH)
        if legacy and legacy_current(cfg, store, model_dir, dataset_fingerprint(cfg.data)):
            assert existing is not None
            return existing  # a synthesis from before synthesis could grow, of these very inputs
        if existing is not None and existing.synthesis is not None:
            check_synthesis(cfg, store, model_dir)
            source = prepare_source(cfg, store, model_dir, report)
            if holds_synthesis_of(existing, store, source, tokenizer_fingerprint(model_dir), cfg.data):
                return existing
            return source
    files = source_files(cfg.data)
    fingerprint = dataset_fingerprint(cfg.data, files)
    tok_sha = tokenizer_fingerprint(model_dir)
    existing = store.read_prepared_manifest()
    if is_current(existing, store, fingerprint, tok_sha, cfg.data):
        assert existing is not None
        return existing
    chat = ChatTokenizer.from_model_dir(model_dir, cfg.data)
    extracted = store.read_run_info() is not None if extracted is None else extracted
    if existing is not None and _can_grow(existing, store, tok_sha, cfg.data, extracted):
        return take_in(cfg, store, existing, files, chat, fingerprint=fingerprint, report=report)
    total, rows = read_rows(cfg.data, files)
    return write_prepared(
        rows,
        chat,
        cfg.data,
        store,
        dataset=cfg.data.dataset,
        fingerprint=fingerprint,
        tokenizer_sha256=tok_sha,
        total=total,
        report=report,
        files=files,
    )
