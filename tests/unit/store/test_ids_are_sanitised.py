"""Crafted sample ids and request ids never name a file outside the shard or dump directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from eagle3.extract.shard import check_unique_paths
from eagle3.store import dump_protocol
from eagle3.store.fsio import MAX_NAME, atomic_write_bytes, remove_stale_temps, safe_name
from eagle3.store.run_store import PreparedSample, RunStore

CRAFTED = [
    "../../x",
    "../../../../../../etc/passwd",
    "/etc/passwd",
    "a/b",
    "a/../../b",
    "..\\..\\windows",
    "..",
    ".",
    "...",
    "",
    "/",
    "//",
    "x" * 10_000,
    "../" * 100 + "escape",
    "é日本語",
    "\u202egnp.exe",  # right-to-left override
    "zero\u200bwidth",
    "emoji-🙂",
    "nul\x00byte",
    "\x00",
    "new\nline",
    "~/.ssh/authorized_keys",
    "$HOME",
    ".hidden",
    ".x.tmp",
    "-rf",
    "a:b*c?d|e<f>g\"h'",
]


def assert_inside(path: Path, directory: Path) -> None:
    assert path.parent == directory, path
    name = path.name
    assert name not in (".", "..") and "/" not in name and "\x00" not in name and "\\" not in name
    assert len(os.fsencode(name)) <= 255 - 20  # room for the writer's ".<name>.<random>.tmp"
    assert path.resolve().is_relative_to(directory.resolve())


@pytest.mark.parametrize("raw", CRAFTED, ids=range(len(CRAFTED)))
def test_a_sample_file_name_stays_in_its_shard_directory_or_is_refused(tmp_path: Path, raw: str) -> None:
    store = RunStore(tmp_path / "store")
    try:
        path = store.sample_path(3, raw)
    except ValueError as e:
        assert raw.strip(".") == "" and "cannot be used as a file name" in str(e)
        return
    assert_inside(path, store.shard_dir(3))
    assert path.name.endswith(".safetensors") and not path.name.endswith(".tmp")
    assert set(safe_name(raw)) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
    assert len(safe_name(raw)) <= MAX_NAME


@pytest.mark.parametrize("raw", CRAFTED, ids=range(len(CRAFTED)))
def test_dump_and_request_file_names_stay_in_the_dump_directory(tmp_path: Path, raw: str) -> None:
    dump = tmp_path / "dump"
    rid = dump_protocol.make_rid("run-1", raw)  # the prefix makes every rid non-empty
    assert rid.startswith(dump_protocol.RID_PREFIX)
    for make in (dump_protocol.dump_path, dump_protocol.request_path, dump_protocol.error_path):
        assert_inside(make(dump, rid), dump)
        try:
            assert_inside(make(dump, raw), dump)  # a raw, unprefixed id from a hostile client
        except ValueError:
            assert raw.strip(".") == ""
    assert_inside(dump_protocol.status_dir(dump) / f"{safe_name(rid)}.json", dump / dump_protocol.STATUS_DIR)


def test_writing_every_crafted_id_creates_files_only_inside_the_store(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "store")
    (tmp_path / "outside").mkdir()
    for raw in CRAFTED:
        try:
            path = store.sample_path(0, raw)
        except ValueError:
            continue
        atomic_write_bytes(path, b"data")
    assert list((tmp_path / "outside").iterdir()) == []
    everything = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert all(p.parent == store.shard_dir(0) for p in everything)
    assert remove_stale_temps(store.shard_dir(0)) == 0  # ".x.tmp" became ".x.tmp.safetensors", not a temp file


def test_ids_that_collide_after_sanitising_are_refused_before_any_write(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    samples = [PreparedSample(sid, [1, 2], [0, 1], "t:0") for sid in ("a/b", "a_b")]
    with pytest.raises(ValueError, match=r"sample ids 'a/b' and 'a_b' map to one file name a_b\.safetensors"):
        check_unique_paths(store, 0, samples)
    long = [PreparedSample("y" * 200 + tail, [1], [1], "t:0") for tail in ("1", "2")]
    with pytest.raises(ValueError, match="map to one file name"):
        check_unique_paths(store, 0, long)
    assert not store.shard_dir(0).exists()
