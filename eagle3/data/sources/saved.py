"""A datasets.save_to_disk directory: listed as all its files (one unit: a change to any re-reads it whole) and
read through datasets.load_from_disk, by data.split when it holds a DatasetDict."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eagle3.data.sources.common import RawRow, Rows, SourceError

SAVED_MARKERS = ("dataset_dict.json", "state.json")  # what datasets.save_to_disk writes at the top


def is_saved_dataset(path: Path) -> bool:
    """A directory written by datasets' save_to_disk (read as one dataset, not file by file)."""
    return path.is_dir() and any((path / m).is_file() for m in SAVED_MARKERS)


def saved_files(path: Path) -> list[Path]:
    """Every file of the directory, in name order."""
    return sorted(p for p in path.rglob("*") if p.is_file())


def read_saved(path: Path, split: str) -> Rows:
    import datasets

    loaded = datasets.load_from_disk(str(path))
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise SourceError(f"{path}: no split {split!r} (splits: {sorted(loaded)}); set data.split")
        loaded = loaded[split]
    ds: Any = loaded
    return len(ds), (RawRow(str(path), i, dict(row)) for i, row in enumerate(ds))
