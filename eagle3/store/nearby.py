"""A run directory that holds no store, or no extraction yet: the errors that say so, with the stores next to it
("did you mean ..."), so verify and retry-failed on a wrong path say what is wrong instead of advising a retry."""

from __future__ import annotations

import difflib
from pathlib import Path

from eagle3.store.paths import RunPaths

RUNS_DIR = Path("data/runs")  # where the pipeline's run directories live by default (relative to the project)


class StoreMissingError(ValueError):
    """The run directory given is not a store a command can work on; the message names it and the fix."""


class NoStoreError(StoreMissingError):
    """No store at all: no prepared/manifest.json (a wrong or empty run directory)."""


class NothingExtractedError(StoreMissingError):
    """A store prepared but never extracted: no run.json."""


def is_store(path: Path) -> bool:
    paths = RunPaths(path)
    return paths.run_json.is_file() or paths.prepared_manifest_path.is_file()


def nearby_stores(root: Path, limit: int = 3) -> list[Path]:
    """Stores inside `root`, beside it and in data/runs/, the names closest to `root`'s first."""
    places = [root, root.parent, RUNS_DIR]
    found = {p for place in places if place.is_dir() for p in place.iterdir() if p.is_dir() and is_store(p)}
    found.discard(root)
    ranked = sorted(found, key=lambda p: (-difflib.SequenceMatcher(None, p.name, root.name).ratio(), str(p)))
    return ranked[:limit]


def did_you_mean(root: Path) -> str:
    near = nearby_stores(root)
    return f" Did you mean {' or '.join(f'`{p}`' for p in near)}?" if near else f" No store is in {RUNS_DIR}/ either."


def require_store(root: Path, purpose: str, extracted: bool = True) -> None:
    """Raise NoStoreError when `root` holds no prepared store, NothingExtractedError when `extracted` is asked
    for and nothing was extracted into it; `purpose` says what the caller would have done ("nothing to verify")."""
    paths = RunPaths(root)
    if not paths.prepared_manifest_path.is_file() and not paths.run_json.is_file():
        state = "does not exist" if not root.exists() else "is not a store (no prepared/manifest.json, no run.json)"
        raise NoStoreError(f"{root.resolve()} {state}: {purpose}.{did_you_mean(root)}")
    if extracted and not paths.run_json.is_file():
        raise NothingExtractedError(
            f"{paths.run_json} missing: {root.resolve()} was prepared but nothing was extracted into it yet: "
            f"{purpose}; run the extract stage on it first"
        )
