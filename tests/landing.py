"""Landing a data file the way a nightly job should (the intake tests and the scheduled-run test share it)."""

from __future__ import annotations

import json
import os
from pathlib import Path


def drop(folder: Path, name: str, rows: list[dict]) -> Path:
    """Write JSON Lines under a dot name (intake skips those), then rename into place: never seen half-written."""
    tmp = folder / f".{name}.part"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.replace(tmp, folder / name)
    return folder / name
