"""What `data.dataset` names on disk: its files, each with a content fingerprint.

    list_source_files("data/traffic/")          every .jsonl/.json/.parquet under the folder (recursive)
    list_source_files("data/traffic/*.jsonl")   a glob (`**` recurses)
    list_source_files("data/convs.jsonl")       one file
    list_source_files("data/saved")             a datasets.save_to_disk directory: all its files, one unit

A growing dataset is a folder or glob that keeps receiving files; prepare takes in only the files whose
fingerprint it has not seen (eagle3.data.prepare). This is the one place that lists and fingerprints source files;
other source kinds (a list of sources, a dataset by name) resolve to the same `SourceFile` records.
"""

from __future__ import annotations

import glob
import hashlib
from dataclasses import dataclass
from pathlib import Path

SUFFIXES = (".jsonl", ".json", ".parquet")
SAVED_MARKERS = ("dataset_dict.json", "state.json")  # what datasets.save_to_disk writes at the top
_MAGIC = ("*", "?", "[")


class SourceError(ValueError):
    """data.dataset names nothing readable; the message names the path and what is accepted."""


@dataclass(frozen=True)
class SourceFile:
    """One input file: its name as recorded (the path as listed), size and sha256 of its bytes."""

    name: str
    path: Path
    size: int
    sha256: str


def is_glob(spec: str) -> bool:
    return any(c in spec for c in _MAGIC)


def is_saved_dataset(path: Path) -> bool:
    """A directory written by datasets' save_to_disk (read as one dataset, not file by file)."""
    return path.is_dir() and any((path / m).is_file() for m in SAVED_MARKERS)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


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
        return sorted(p for p in path.rglob("*") if p.is_file())
    return sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in SUFFIXES and not p.name.startswith("."))


def list_source_files(spec: str) -> list[SourceFile]:
    """The files `spec` names now, in name order, each fingerprinted (sha256 of its bytes). A folder or glob
    that matches no file yet is an empty list (a nightly folder may start empty); a missing path raises."""
    return [SourceFile(str(p), p, p.stat().st_size, file_sha256(p)) for p in _paths(spec)]
