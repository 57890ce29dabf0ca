"""Prefect artifacts: the keys (derived from the run directory's name, so the UI's Artifacts page keeps one
history per run directory across flow runs), table and markdown artifacts, and links to them in the UI.
Progress artifacts are tasks/progress.py's; the run's summary is tasks/summary.py's.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, cast
from uuid import UUID

from prefect.artifacts import (
    create_markdown_artifact,
    create_table_artifact,
)

from eagle3.store.paths import FIRST_METHOD

_KEY_JUNK = re.compile(r"[^a-z0-9]+")


def artifact_key(*parts: str) -> str:
    """Join parts into a Prefect artifact key: lowercase letters, digits and single dashes."""
    key = "-".join(_KEY_JUNK.sub("-", p.lower()).strip("-") for p in parts)
    key = re.sub("-+", "-", key).strip("-")
    if not key:
        raise ValueError(f"cannot build an artifact key from {parts!r}")
    return key


def run_prefix(run_dir: str | Path) -> str:
    """What every artifact key of a run directory starts with: its name as a key, e.g. `demo`."""
    return artifact_key(Path(run_dir).resolve().name or "run")


def run_key(run_dir: str | Path, what: str) -> str:
    """Stable key for one artifact of one run directory, e.g. `demo-extract-progress`."""
    return artifact_key(run_prefix(run_dir), what)


def method_key(run_dir: str | Path, method: str, what: str) -> str:
    """run_key of one draft method's artifact: EAGLE-3's keep the names they had (`demo-train-progress`), another
    method's carry its name (`demo-eagle3-1-train-progress`), so several methods of one run keep their own history."""
    return run_key(run_dir, what if method == FIRST_METHOD else f"{method}-{what}")


def table_artifact(key: str, rows: list[dict[str, Any]], description: str) -> UUID:
    return cast(UUID, create_table_artifact(rows, key=key, description=description))


def markdown_artifact(key: str, markdown: str, description: str) -> UUID:
    return cast(UUID, create_markdown_artifact(markdown, key=key, description=description))


#: What the summary links to in the UI: stage artifacts (keyed per run directory) that exist after each stage.
STAGE_ARTIFACTS = {
    "prompts": ["prompts-progress", "prompts-summary"],
    "prepare": ["prepare-progress"],
    "synthesize": ["synthesize-progress", "synthesize-summary", "synthesize-failed"],
    "extract": ["extract-progress", "extract-shards", "extract-failed-shards", "extract-summary"],
    "convert": ["convert-progress"],
    "train": ["train-progress", "train-metrics", "train-curves"],
    "export": ["export-progress", "export"],
    "evaluate": ["evaluate-progress", "evaluation", "promotion"],
}


def ui_link(key: str) -> str:
    """Markdown link to the history of an artifact key in the Prefect UI (plain text when the UI URL is unknown)."""
    from prefect.settings import PREFECT_UI_URL

    base = PREFECT_UI_URL.value()
    return f"[{key}]({base.rstrip('/')}/artifacts/key/{key})" if base else f"`{key}`"
