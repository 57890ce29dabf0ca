"""What `eagle3 verify` prints off a terminal: every bad sample id in full with its reason, however narrow the
output, and a summary in plain English that names the retry-failed deployment as well as `eagle3 retry`."""

from __future__ import annotations

from pathlib import Path

import pytest

from eagle3.extract.shard import extract_shard
from flows import cli
from tests.unit.tiny_store import ScriptedEngine, make_store


def test_every_bad_sample_is_printed_in_full_with_its_reason_and_how_to_redo_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "40")  # narrower than any reason: nothing may be cut
    store, info = make_store(tmp_path / "a-run-directory-with-a-rather-long-name", [[6, 9, 4], [5, 8]])
    for shard in (0, 1):
        assert extract_shard(store, shard, ScriptedEngine(info), info).status == "complete"
    for shard, sample in ((0, "s0-000"), (0, "s0-002"), (1, "s1-001")):
        path = store.sample_path(shard, sample)
        path.write_bytes(path.read_bytes()[:-10])
    assert cli.main(["verify", str(store.root)]) == 1
    out = capsys.readouterr().out
    bad = [line for line in out.splitlines() if line.startswith("bad sample ")]
    assert [line.split(":")[0] for line in bad] == [
        "bad sample s0-000 (shard 00000)",
        "bad sample s0-002 (shard 00000)",
        "bad sample s1-001 (shard 00001)",
    ]
    assert all(len(line) > 40 and "truncated" in line for line in bad)  # the reason, whole
    summary = " ".join(out.split())
    assert "bad: s0-000 (shard 0), s0-002 (shard 0), s1-001 (shard 1)" in summary
    assert f"to redo these 3 samples, run the retry-failed deployment with run_dir {store.root}" in summary
    assert f"`eagle3 retry {store.root}`" in summary and "the 3 samples" not in summary


def test_off_a_terminal_the_tables_first_problem_column_is_whole(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")  # what a pipe or a CI log gets
    store, info = make_store(tmp_path / "run", [[6, 9]])
    assert extract_shard(store, 0, ScriptedEngine(info), info).status == "complete"
    path = store.sample_path(0, "s0-001")
    path.write_bytes(path.read_bytes()[:-10])
    assert cli.main(["verify", str(store.root)]) == 1
    lines = capsys.readouterr().out.splitlines()
    (reason,) = [line.split(": ", 1)[1] for line in lines if line.startswith("bad sample ")]
    (row,) = [line for line in lines if line.startswith("│ 00000")]
    assert f"s0-001: {reason}" in row  # the shard's row, on one line, its first problem whole
    assert len(row) > 80
