"""Hugging Face Hub datasets by name, and dataset repository directories: read through datasets.load_dataset.

    is_hub(source)                 no local path of that name: a Hub dataset id, read through datasets.load_dataset
    load_hub(source)               the Hub dataset (from the local cache when offline); an id that cannot be
                                   reached is a SourceError that names it and says how to pre-download it
    hub_fingerprint(source)        the loaded dataset's own fingerprint (datasets hashes its files)
    read_hub(source)               its rows, named `org/name[subset]:split:<row>`

A local directory that is a dataset repository (data files, no save_to_disk state) is read through the same
`datasets.load_dataset` call as a Hub id: the path the tests use offline.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eagle3.config import DataSource
from eagle3.data.sources.common import RawRow, Rows, SourceError
from eagle3.data.sources.saved import is_saved_dataset

_SPLITS = ("train", "test", "validation", "valid", "dev")


def is_dataset_repository(path: Path) -> bool:
    """A directory laid out as a Hub dataset repository: a dataset card (README.md), or data files named by split
    under data/ (data/train.jsonl, data/train-00000-of-00001.parquet). Any other folder of files is a growing
    dataset (eagle3/data/sources/local.py), taken in file by file."""
    if not path.is_dir() or is_saved_dataset(path):
        return False
    data = path / "data"
    return (path / "README.md").is_file() or (
        data.is_dir() and any(f.is_file() and f.name.startswith(_SPLITS) for f in data.rglob("*"))
    )


def is_hub(source: DataSource) -> bool:
    """Read through datasets.load_dataset: a dataset repository directory, or a name that is no local path and
    looks like a Hub id (`name` or `org/name`: relative, no file suffix); a missing `x.jsonl` stays a local path."""
    path = Path(source.dataset)
    if path.exists():
        return is_dataset_repository(path)
    return not path.is_absolute() and path.suffix == "" and len(path.parts) <= 2 and not source.dataset.startswith(".")


def hub_name(source: DataSource) -> str:
    """How bad rows name a Hub source: `org/name[subset]:split` (then `:<row>`)."""
    subset = f"[{source.subset}]" if source.subset else ""
    return f"{source.dataset}{subset}:{source.split}"


def load_hub(source: DataSource) -> Any:
    """datasets.load_dataset(dataset, subset, split=..., revision=...); unreachable -> SourceError."""
    import datasets

    try:
        return datasets.load_dataset(source.dataset, source.subset, split=source.split, revision=source.revision)
    except Exception as e:  # ConnectionError, DatasetNotFoundError, FileNotFoundError, ValueError (bad split) ...
        if Path(source.dataset).exists():
            raise SourceError(
                f"data.dataset {source.dataset!r} (subset {source.subset}, split {source.split}): "
                f"datasets.load_dataset could not read this dataset repository directory ({type(e).__name__}: "
                f"{str(e)[:300]}); check its data files and the split name"
            ) from None
        subset = f", {source.subset!r}" if source.subset else ""
        revision = f", revision={source.revision!r}" if source.revision else ""
        raise SourceError(
            f"data.dataset {source.dataset!r} (subset {source.subset}, split {source.split}): not a local path, and "
            f"datasets.load_dataset could not read it ({type(e).__name__}: {str(e)[:300]}). If it is a Hugging Face "
            'Hub dataset and this machine is offline, pre-download it where there is network: `python -c "import '
            f"datasets; datasets.load_dataset({source.dataset!r}{subset}, split={source.split!r}{revision})"
            ".save_to_disk('data/my_dataset')\"` and set data.dataset to that directory (or copy the Hugging Face "
            "cache, HF_HOME, and set HF_DATASETS_OFFLINE=1)"
        ) from None


def hub_fingerprint(source: DataSource) -> str:
    ds = load_hub(source)
    return f"{source.model_dump_json()}:{getattr(ds, '_fingerprint', '')}"


def read_hub(source: DataSource) -> Rows:
    ds = load_hub(source)
    name = hub_name(source)
    return len(ds), (RawRow(name, i, dict(row)) for i, row in enumerate(ds))
