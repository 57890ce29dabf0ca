"""Prefect events about a run directory, one resource per run (`eagle3.run.<run directory name>`), for automations
(deploy/automations/) and the UI's event feed.

    eagle3.disk.low, eagle3.shard.failed, eagle3.run.completed   the extract flows (tasks/extract/report.py)
    eagle3.server.reaped                                         a server a dead run left behind (tasks/server.py)
    eagle3.draft.promoted, eagle3.draft.kept                     the promote stage (tasks/promote.py)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect.events import emit_event


def emit_run_event(run_dir: str, event: str, payload: dict[str, Any]) -> None:
    """A Prefect event about the run directory: resource `eagle3.run.<name>` (related: the current run)."""
    name = Path(run_dir).resolve().name or "run"
    resource = {
        "prefect.resource.id": f"eagle3.run.{name}",
        "prefect.resource.name": name,
        "eagle3.run_dir": str(Path(run_dir).resolve()),
    }
    emit_event(event=event, resource=resource, payload=payload)
