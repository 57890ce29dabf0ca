"""Local files: what `data.dataset` names on disk, each file with a content fingerprint, and their rows.

    list_source_files("data/traffic/")          every .jsonl/.json/.parquet under the folder (recursive)
    list_source_files("data/traffic/*.jsonl")   a glob (`**` recurses)
    list_source_files("data/convs.jsonl")       one file
    list_source_files("data/saved")             a datasets.save_to_disk directory: all its files, one unit (saved.py)
    read_local(source, files)                   the rows of `files` (default: all), JSON lines read here

A growing dataset is a folder or glob that keeps receiving files; prepare takes in only the files whose
fingerprint it has not seen (eagle3.data.prepare). This is the one place that lists and fingerprints source files;
other source kinds (a list of sources, a dataset by name) resolve to the same `SourceFile` records.
"""

from __future__ import annotations

import glob
import json
from collections.abc import Iterator
from pathlib import Path

from eagle3.config import DataSource
from eagle3.data.sources.common import RawRow, Rows, SourceError, SourceFile, chain_rows, file_sha256
from eagle3.data.sources.saved import is_saved_dataset, read_saved, saved_files

SUFFIXES = (".jsonl", ".json", ".parquet")
_MAGIC = ("*", "?", "[")


def is_glob(spec: str) -> bool:
    return any(c in spec for c in _MAGIC)


def _paths(spec: str) -> list[Path]:
    if is_glob(spec):
        found = sorted(Path(p) for p in glob.glob(spec, recursive=True))
        return [p for p in found if p.is_file() and p.suffix in SUFFIXES]
    path = Path(spec)
    if not path.exists():
        raise SourceError(
            f"data.dataset: {path} does not exist (a .jsonl/.json/.parquet file, a folder or glob of them, "
            "or a save_to_disk dir)"
        )
    if path.is_file():
        if path.suffix not in SUFFIXES:
            raise SourceError(
                f"data.dataset: {path} has unsupported type {path.suffix!r}; expected {SUFFIXES}, a folder or a glob"
            )
        return [path]
    if is_saved_dataset(path):
        return saved_files(path)
    return sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in SUFFIXES and not p.name.startswith("."))


def list_source_files(spec: str) -> list[SourceFile]:
    """The files `spec` names now, in name order, each fingerprinted (sha256 of its bytes). A folder or glob
    that matches no file yet is an empty list (a nightly folder may start empty); a missing path raises."""
    return [SourceFile(str(p), p, p.stat().st_size, file_sha256(p)) for p in _paths(spec)]


# reading -----------------------------------------------------------------------------------------
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


def _read_file(path: Path, name: str) -> Rows:
    if path.suffix in (".jsonl", ".json") and _is_json_lines(path):
        return _count_lines(path), read_json_lines(path, name)
    import datasets  # only for what JSON Lines is not: Parquet, JSON arrays

    builder = "parquet" if path.suffix == ".parquet" else "json"
    ds = datasets.load_dataset(builder, data_files=str(path), split="train", streaming=True)
    total = 0
    if builder == "parquet":
        import pyarrow.parquet as pq

        total = pq.ParquetFile(path).metadata.num_rows
    return total, (RawRow(name, i, dict(row)) for i, row in enumerate(ds))


def read_local(source: DataSource, files: list[SourceFile] | None) -> Rows:
    """`files` of a local file, folder or glob (default: all of them); a save_to_disk directory is read whole."""
    path = Path(source.dataset)
    listed = list_source_files(source.dataset) if files is None or is_saved_dataset(path) else files
    if is_saved_dataset(path):
        return read_saved(path, source.split)
    return chain_rows([_read_file(f.path, f.name) for f in listed])
