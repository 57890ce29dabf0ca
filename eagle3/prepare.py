"""prepare: conversations (JSONL, Parquet, save_to_disk dir) -> token ids + loss mask -> prepared shards.

    rows ─► normalize (ShareGPT / OpenAI) ─► chat template + loss mask ─► dedup by sample id ─► shards

A row that cannot become a sample is a BadRow (file, row, reason): skipped and recorded in the
manifest with data.on_bad_row=skip, a PrepareError with `fail`. Rows are numbered from 0 (for JSON
lines: the line number - 1). `write_prepared` is the one tokenization path; synthesize reuses it.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from eagle3.chat import ChatTokenizer, RowError, RowFormat, normalize_row, sample_id
from eagle3.config import DataConfig, PipelineConfig
from eagle3.model_files import tokenizer_fingerprint
from eagle3.progress import ProgressCounter, ProgressFn, no_progress
from eagle3.sources import DataSource, SourceError, data_sources, hub_fingerprint, hub_name, is_hub, load_hub
from eagle3.store import PREPARED_SCHEMA, BadRow, PreparedManifest, RunStore

_SUFFIXES = (".jsonl", ".json", ".parquet")


class PrepareError(RuntimeError):
    """The dataset cannot be prepared; the message names the file, row or key and the fix."""


@dataclass(frozen=True)
class RawRow:
    """One input row, or the reason it could not even be read (bad JSON, bad UTF-8)."""

    file: str
    row: int
    data: dict[str, Any] | None
    error: str | None = None
    origin: str | None = None  # `source` to record instead of "<file>:<row>" (synthesize keeps the original)


# reading -----------------------------------------------------------------------------------------
def _check_path(path: Path) -> None:
    if not path.exists():
        raise PrepareError(f"data.dataset: {path} does not exist (a .jsonl/.json/.parquet file or a save_to_disk dir)")
    if path.is_file() and path.suffix not in _SUFFIXES:
        raise PrepareError(f"data.dataset: {path} has unsupported type {path.suffix!r}; expected {_SUFFIXES} or a dir")
    if path.is_dir() and not any(path.glob("*.json")):
        raise PrepareError(f"data.dataset: {path} is a directory but not one written by datasets' save_to_disk")


def dataset_files(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]


def dataset_fingerprint(data: DataConfig) -> str:
    """sha256 over the data config and each source: a local one's files (names and bytes), a Hub one's own
    fingerprint (eagle3/sources.py)."""
    h = hashlib.sha256(json.dumps(data.model_dump(mode="json"), sort_keys=True).encode())
    if data.chat_template is not None and Path(data.chat_template).is_file():  # its text, not only its name
        h.update(b"\0chat_template\0" + Path(data.chat_template).read_bytes())
    for source in data_sources(data):
        if is_hub(source):
            try:
                h.update(hub_fingerprint(source).encode())
            except SourceError as e:
                raise PrepareError(str(e)) from None
        else:
            _hash_files(h, Path(source.dataset))
    return h.hexdigest()


def _hash_files(h: Any, path: Path) -> None:
    _check_path(path)
    for f in dataset_files(path):
        h.update(f"\0{f.relative_to(path) if path.is_dir() else f.name}\0{f.stat().st_size}\0".encode())
        with open(f, "rb") as fh:
            while chunk := fh.read(8 << 20):
                h.update(chunk)


def _is_json_lines(path: Path) -> bool:
    with open(path, "rb") as f:
        head = f.read(4096).lstrip()
    return not head.startswith(b"[")


def read_json_lines(path: Path, file: str | None = None) -> Iterator[RawRow]:
    """Each non-blank line is a row; a line that is not UTF-8 JSON is a row with an error."""
    name = file or str(path)
    with open(path, "rb") as f:
        for i, raw in enumerate(f):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError as e:
                yield RawRow(name, i, None, f"not decodable as UTF-8 ({e.reason} at byte {e.start})")
                continue
            except json.JSONDecodeError as e:
                yield RawRow(name, i, None, f"not valid JSON ({e.msg} at column {e.colno})")
                continue
            if isinstance(obj, dict):
                yield RawRow(name, i, obj)
            else:
                yield RawRow(name, i, None, f"unknown schema: the row is a JSON {type(obj).__name__}, not an object")


def _count_lines(path: Path) -> int:
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def read_rows(data: DataConfig) -> tuple[int, Iterator[RawRow]]:
    """(number of rows, or 0 when unknown; the rows in input order): every source of `data`, in order."""
    sources = data_sources(data)
    if len(sources) == 1 and not is_hub(sources[0]):
        return _read_local(data)
    parts = [_read_source(data, s) for s in sources]
    total = 0 if any(n == 0 for n, _ in parts) else sum(n for n, _ in parts)
    return total, itertools.chain.from_iterable(rows for _, rows in parts)


def _read_source(data: DataConfig, source: DataSource) -> tuple[int, Iterator[RawRow]]:
    rows: Iterator[RawRow]
    if is_hub(source):
        try:
            ds = load_hub(source)
        except SourceError as e:
            raise PrepareError(str(e)) from None
        name = hub_name(source)
        total, rows = len(ds), (RawRow(name, i, dict(row)) for i, row in enumerate(ds))
    else:
        total, rows = _read_local(data.model_copy(update={"dataset": source.dataset, "split": source.split}))
    if source.max_samples is not None:
        rows = itertools.islice(rows, source.max_samples)
        total = min(total, source.max_samples) if total else 0
    return total, rows


def _read_local(data: DataConfig) -> tuple[int, Iterator[RawRow]]:
    """A local file or save_to_disk directory (`data.dataset`); no network."""
    path = Path(data.dataset)
    _check_path(path)
    name = str(data.dataset)
    if path.suffix in (".jsonl", ".json") and _is_json_lines(path):
        return _count_lines(path), read_json_lines(path, name)
    import datasets  # only for what JSON Lines is not: Parquet, JSON arrays, saved datasets

    if path.is_dir():
        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.DatasetDict):
            if data.split not in loaded:
                raise PrepareError(f"{path}: no split {data.split!r} (splits: {sorted(loaded)}); set data.split")
            loaded = loaded[data.split]
        ds: Any = loaded
        total = len(ds)
    else:
        builder = "parquet" if path.suffix == ".parquet" else "json"
        ds = datasets.load_dataset(builder, data_files=str(path), split="train", streaming=True)
        total = 0
        if builder == "parquet":
            import pyarrow.parquet as pq

            total = pq.ParquetFile(path).metadata.num_rows
    return total, (RawRow(name, i, dict(row)) for i, row in enumerate(ds))


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


class _ShardWriter:
    def __init__(self, store: RunStore, shard_size: int):
        self.store, self.shard_size = store, shard_size
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
        self.store.write_prepared_shard(len(self.shards), table)
        self.shards.append(len(self.rows))
        self.shard_tokens.append(sum(r["num_tokens"] for r in self.rows))
        self.rows = []

    def remove_stale(self) -> None:
        for p in self.store.prepared_dir.glob("shard-*.arrow"):
            idx = p.stem.removeprefix("shard-")
            if not idx.isdigit() or int(idx) >= len(self.shards):
                p.unlink()


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
) -> PreparedManifest:
    """Tokenize rows into prepared shards and write the manifest (the one tokenization path)."""
    manifest_path = store.prepared_dir / "manifest.json"
    manifest_path.unlink(missing_ok=True)  # no manifest while shards are rewritten: a crash is not "done"
    limit = data.max_samples
    counter = ProgressCounter(stage, min(total, limit) if total and limit else (total or limit or 0), report)
    writer = _ShardWriter(store, data.shard_size)
    seen: set[str] = set()
    bad: list[BadRow] = []
    duplicates = num_loss = 0
    for raw in rows:
        if limit is not None and len(seen) >= limit:
            break
        counter.total = max(counter.total, counter.done + 1)
        try:
            if raw.error is not None:
                raise RowError(raw.error)
            assert raw.data is not None
            messages = normalize_row(raw.data, fmt or data.format)
            tok = chat.tokenize(messages, data.max_length, data.truncate)
        except RowError as e:
            if data.on_bad_row == "fail":
                raise PrepareError(
                    f"{raw.file}: row {raw.row}: {e}. Fix or drop the row, or set data.on_bad_row=skip "
                    "to skip bad rows and list them in prepared/manifest.json"
                ) from None
            bad.append(BadRow(file=raw.file, row=raw.row, reason=str(e)))
            counter.add(1, failed=1)
            continue
        sid = sample_id(messages)
        if sid in seen:
            duplicates += 1
            counter.add(1, skipped=1)
            continue
        seen.add(sid)
        num_loss += tok.num_loss_tokens
        writer.add(
            {
                "sample_id": sid,
                "input_ids": tok.input_ids,
                "loss_mask": tok.loss_mask,
                "num_tokens": len(tok.input_ids),
                "source": raw.origin or f"{raw.file}:{raw.row}",
                "messages": json.dumps(messages, ensure_ascii=False),
            }
        )
        counter.add(1, tokens=len(tok.input_ids))
    writer.flush()
    writer.remove_stale()
    manifest = PreparedManifest(
        dataset=dataset,
        dataset_fingerprint=fingerprint,
        tokenizer_sha256=tokenizer_sha256,
        num_samples=sum(writer.shards),
        num_tokens=sum(writer.shard_tokens),
        num_loss_tokens=num_loss,
        shards=writer.shards,
        shard_tokens=writer.shard_tokens,
        bad_rows=bad,
        duplicates=duplicates,
        config=data.model_dump(mode="json"),
    )
    store.write_prepared_manifest(manifest)
    counter.finish()
    return manifest


def prepare(
    cfg: PipelineConfig, store: RunStore, model_dir: Path, report: ProgressFn = no_progress
) -> PreparedManifest:
    """Prepare cfg.data into store/prepared; returns the existing manifest when inputs are unchanged."""
    fingerprint = dataset_fingerprint(cfg.data)
    tok_sha = tokenizer_fingerprint(model_dir)
    existing = store.read_prepared_manifest()
    if is_current(existing, store, fingerprint, tok_sha, cfg.data):
        assert existing is not None
        return existing
    chat = ChatTokenizer.from_model_dir(model_dir, cfg.data)
    total, rows = read_rows(cfg.data)
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
    )
