"""Progress artifacts without a server: keys, text, throttling, and a broken API that never fails the task."""

from __future__ import annotations

import logging
from typing import Any
from uuid import UUID, uuid4

import pytest

import tasks.artifacts as art
import tasks.progress as prog
from eagle3.progress import Progress


def test_keys_are_lowercase_letters_digits_and_single_dashes() -> None:
    assert art.artifact_key("My Run_01", "extract-progress") == "my-run-01-extract-progress"
    assert art.run_key("/data/runs/Demo.v2/", "extract-shards") == "demo-v2-extract-shards"
    with pytest.raises(ValueError):
        art.artifact_key("__", "")


def test_the_description_reads_n_of_m_rate_and_eta() -> None:
    assert prog.describe(40, 200, "samples", 1234.4, 95) == "40/200 samples, 1234 tok/s, ETA 95s"
    assert prog.describe(0, 5, "rows", 0.0, None, "2 failed") == "0/5 rows, 0 tok/s, ETA ?, 2 failed"
    assert prog.format_eta(3725) == "62m05s" and prog.format_eta(4 * 3600 + 60) == "4h01m"
    assert prog.text_bar(0.5).startswith("[" + "#" * 12 + "-" * 12 + "]")


class FakeApi:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.calls: list[tuple[str, float, str | None]] = []

    def create(self, progress: float, key: str | None = None, description: str | None = None) -> UUID:
        if self.fail:
            raise ConnectionError("server down")
        self.calls.append(("create", progress, description))
        return uuid4()

    def update(self, artifact_id: UUID, progress: float, description: str | None = None) -> UUID:
        self.calls.append(("update", progress, description))
        return artifact_id


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> FakeApi:
    fake = FakeApi()
    monkeypatch.setattr(prog, "create_progress_artifact", fake.create)
    monkeypatch.setattr(prog, "update_progress_artifact", fake.update)
    return fake


def progress(done: int, total: int = 10, elapsed: float = 1.0, **kw: Any) -> Progress:
    return Progress("extract", done, total, tokens=100 * done, elapsed_s=elapsed, **kw)


def test_updates_are_throttled_in_place_and_the_end_is_always_written(api: FakeApi) -> None:
    report = prog.TaskProgress(logging.getLogger("t"), "shard 0", min_interval_s=3600)
    for done in range(1, 11):
        report(progress(done))
    assert [c[0] for c in api.calls] == ["create", "update"]  # first report, then only the final one
    assert api.calls[-1][1] == 100.0 and api.calls[-1][2] == "10/10 samples, 1000 tok/s, ETA 0s"


def test_a_failing_api_is_logged_once_and_never_raises(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeApi(fail=True)
    monkeypatch.setattr(prog, "create_progress_artifact", fake.create)
    report = prog.TaskProgress(logging.getLogger("t"), "prepare", key="k", min_interval_s=0)
    with caplog.at_level(logging.WARNING):
        for done in range(1, 4):
            report(progress(done, total=3))
    assert sum("write failed" in r.message for r in caplog.records) == 1
