"""A long step is never silent: TaskProgress, used around a library call, creates its artifact at once, writes
the last figures with the time since the start whenever the library has said nothing for `heartbeat_s`, ends
on the step's own final figures, and stops beating when the step ends. No server: the artifact API is faked."""

from __future__ import annotations

import logging
import time
from typing import Any
from uuid import UUID, uuid4

import pytest

import tasks.progress as prog
from eagle3.progress import Progress


class FakeApi:
    def __init__(self) -> None:
        self.calls: list[tuple[float, float, str]] = []  # (time, percent, description)

    def create(self, progress: float, key: str | None = None, description: str | None = None) -> UUID:
        self.calls.append((time.monotonic(), progress, description or ""))
        return uuid4()

    def update(self, artifact_id: UUID, progress: float, description: str | None = None) -> UUID:
        self.calls.append((time.monotonic(), progress, description or ""))
        return artifact_id


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> FakeApi:
    fake = FakeApi()
    monkeypatch.setattr(prog, "create_progress_artifact", fake.create)
    monkeypatch.setattr(prog, "update_progress_artifact", fake.update)
    return fake


def test_a_silent_step_shows_it_is_working_from_the_start_and_then_every_beat(
    api: FakeApi, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    report = prog.TaskProgress(logging.getLogger("t"), "convert", key="k", heartbeat_s=0.3)
    start = time.monotonic()
    with report:
        assert api.calls and api.calls[0][2] == "convert: started"  # at once, before any figure
        time.sleep(1.0)  # the library says nothing (loading, one long sample)
        report(Progress("convert", 4, 10, 400, 1.0))
        time.sleep(0.8)
    beats = [c for c in api.calls if "working for" in c[2]]
    assert len(beats) >= 4
    gaps = [b - a for a, b in zip([start, *(c[0] for c in api.calls)], [c[0] for c in api.calls], strict=False)]
    assert max(gaps) < 0.3 + 1.1  # never silent much longer than a beat (the beat polls every second at most)
    assert beats[0][2].startswith("no figures yet; working for ")
    assert any(c[2].startswith("4/10 samples") and "working for" in c[2] for c in beats)  # the last figures
    assert any("convert" in r.getMessage() and "working for" in r.getMessage() for r in caplog.records)
    n = len(api.calls)
    time.sleep(0.7)
    assert len(api.calls) == n  # the beat stopped with the step


def test_the_final_figure_is_the_steps_own(api: FakeApi) -> None:
    report = prog.TaskProgress(logging.getLogger("t"), "train", key="k", unit="steps", heartbeat_s=30)
    with report:
        for step in range(1, 6):
            report(Progress("train", step, 5, 1000 * step, float(step)))
    last: Any = api.calls[-1]
    assert last[1] == 100.0 and last[2].startswith("5/5 steps, 1000 tok/s")


def test_a_step_that_fails_leaves_its_artifact_saying_failed_with_the_error(
    api: FakeApi, caplog: pytest.LogCaptureFixture
) -> None:
    report = prog.TaskProgress(logging.getLogger("t"), "prepare", key="k", unit="rows", heartbeat_s=30)
    with pytest.raises(FileNotFoundError), report:
        raise FileNotFoundError("data/x.jsonl: no such file\nsecond line")
    last = api.calls[-1][2]
    assert last.startswith("Failed after ") and "FileNotFoundError: data/x.jsonl: no such file (no figures yet)" in last
    assert "started" not in last and "second line" not in last
    report = prog.TaskProgress(logging.getLogger("t"), "train", key="k2", unit="steps", heartbeat_s=30)
    with report:
        report(Progress("train", 3, 10, 300, 3.0))
    report.fail(RuntimeError("torchrun exited with 1"))  # a failure found after the step's `with` (tasks/train.py)
    assert api.calls[-1][1] == 30.0
    assert api.calls[-1][2].endswith("RuntimeError: torchrun exited with 1 (3/10 steps, 100 tok/s, ETA ?)")
