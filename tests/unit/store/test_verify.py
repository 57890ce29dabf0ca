"""verify_run finds every kind of damage, quarantines it, and leaves manifests that make a re-run redo exactly it;
the retry planner names exactly the shards and samples that are missing."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
import torch

from eagle3.extract.shard import extract_shard
from eagle3.store.failed_shards import failed_shards, missing_samples, plan_retry, plan_retry_samples, shard_summaries
from eagle3.store.lock import RunLock, RunLockedError
from eagle3.store.nearby import NoStoreError, NothingExtractedError
from eagle3.store.run_store import RunInfo, RunStore
from eagle3.store.sample_format import encode_sample, write_sample
from eagle3.store.verify import QUARANTINE, VerifyError, verify_run
from tests.unit.tiny_store import ScriptedEngine, hidden, make_store

LENGTHS = [[6, 9, 12, 7], [5, 8]]


@pytest.fixture
def filled(tmp_path: Path) -> tuple[RunStore, RunInfo]:
    store, info = make_store(tmp_path / "run", LENGTHS)
    for shard in range(len(LENGTHS)):
        assert extract_shard(store, shard, ScriptedEngine(info), info).status == "complete"
    return store, info


def data_offset(path: Path) -> int:
    (n,) = struct.unpack("<Q", path.read_bytes()[:8])
    return 8 + n


def redo(store: RunStore, info: RunInfo, shard: int) -> list[list[str]]:
    engine = ScriptedEngine(info)
    assert extract_shard(store, shard, engine, info).status == "complete"
    return engine.calls


def test_a_sound_store_verifies_clean_and_its_manifests_are_not_rewritten(filled: tuple[RunStore, RunInfo]) -> None:
    store, _ = filled
    before = [store.manifest_path(s).stat().st_mtime_ns for s in range(2)]
    rep = verify_run(store)
    assert rep.clean and rep.bad_count == 0 and rep.ok_count == 6 and rep.missing_count == 0
    assert [s.status_after for s in rep.shards] == ["complete", "complete"]
    assert [store.manifest_path(s).stat().st_mtime_ns for s in range(2)] == before
    assert not (store.root / QUARANTINE).exists()
    assert plan_retry(store) == [] and failed_shards(store) == []


def test_a_truncated_file_is_quarantined_marked_and_redone_alone(filled: tuple[RunStore, RunInfo]) -> None:
    store, info = filled
    path = store.sample_path(0, "s0-002")
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])
    rep = verify_run(store)
    assert rep.bad_count == 1 and not rep.clean
    shard = rep.shards[0]
    assert list(shard.bad) == ["s0-002"] and "truncated" in shard.bad["s0-002"]
    assert (shard.status_before, shard.status_after) == ("complete", "partial")
    assert not path.exists()
    quarantined = store.root / QUARANTINE / "shard-00000" / path.name
    assert quarantined.read_bytes() == whole[: len(whole) // 2]  # kept, not deleted
    m = store.read_manifest(0)
    assert m is not None and m.status == "partial" and "s0-002" not in m.samples
    assert m.errors["s0-002"].startswith("verify: ") and len(m.samples) == 3
    assert plan_retry_samples(store) == {0: ["s0-002"]}
    assert "eagle3 retry" in rep.summary() and "run the retry-failed deployment" in rep.summary()
    assert "bad: s0-002 (shard 0)" in rep.summary() and "to redo it," in rep.summary()
    assert redo(store, info, 0) == [["s0-002"]]
    assert verify_run(store).clean


def test_flipped_bytes_fail_the_checksum_but_pass_a_header_only_check(filled: tuple[RunStore, RunInfo]) -> None:
    store, _ = filled
    path = store.sample_path(1, "s1-000")
    data = bytearray(path.read_bytes())
    data[data_offset(path) + 100] ^= 0xFF
    path.write_bytes(bytes(data))
    assert verify_run(store, full=False).clean
    rep = verify_run(store)
    assert list(rep.shards[1].bad) == ["s1-000"] and "checksum" in rep.shards[1].bad["s1-000"]


def test_non_finite_values_wrong_ids_wrong_mask_and_a_wrong_sample_are_all_caught(
    filled: tuple[RunStore, RunInfo],
) -> None:
    store, info = filled
    samples = {s.sample_id: s for s in store.prepared_samples(0)}

    def rewrite(sid: str, *, ids: list[int] | None = None, mask: list[int] | None = None, nan: bool = False,
                as_id: str | None = None) -> None:  # fmt: skip
        s = samples[sid]
        aux, last = hidden(s, info)
        if nan:
            aux[0, 0, 0] = float("nan")
        data = encode_sample(
            as_id or sid, info.aux_layers, torch.tensor(ids or s.input_ids),
            torch.tensor(mask or s.loss_mask, dtype=torch.uint8), aux, last,
        )  # fmt: skip
        write_sample(store.sample_path(0, sid), data)
        m = store.read_manifest(0)
        assert m is not None
        m.samples.pop(sid)  # as if written after the last manifest: no checksum to compare with
        store.write_manifest(m)

    rewrite("s0-000", nan=True)
    rewrite("s0-001", ids=[1] * len(samples["s0-001"]))
    rewrite("s0-002", mask=[1] * len(samples["s0-002"]))
    rewrite("s0-003", as_id="someone-else")
    bad = verify_run(store).shards[0].bad
    assert "non-finite" in bad["s0-000"] and "token ids" in bad["s0-001"]
    assert "loss mask" in bad["s0-002"] and "written for sample 'someone-else'" in bad["s0-003"]
    assert verify_run(store).shards[0].missing == ["s0-000", "s0-001", "s0-002", "s0-003"]


def test_a_listed_file_that_vanished_is_bad_and_an_unlisted_sound_file_is_adopted(
    filled: tuple[RunStore, RunInfo],
) -> None:
    store, _ = filled
    store.sample_path(0, "s0-001").unlink()
    m = store.read_manifest(0)
    assert m is not None
    entry = m.samples.pop("s0-003")
    m.status = "running"  # a killed run: its last manifest predates its last writes
    store.write_manifest(m)
    rep = verify_run(store)
    shard = rep.shards[0]
    assert shard.bad == {"s0-001": "listed in the manifest but the file is missing"}
    assert shard.adopted == ["s0-003"] and shard.status_after == "partial"
    back = store.read_manifest(0)
    assert back is not None and back.samples["s0-003"] == entry


def test_orphans_and_temp_files_are_cleared_without_counting_as_bad(filled: tuple[RunStore, RunInfo]) -> None:
    store, _ = filled
    d = store.shard_dir(1)
    (d / "stranger.safetensors").write_bytes(b"x" * 10)
    (d / ".s1-000.safetensors.abc.tmp").write_bytes(b"half")
    rep = verify_run(store)
    assert rep.clean and rep.shards[1].orphans == ["stranger.safetensors"] and rep.shards[1].temps_removed == 1
    assert (store.root / QUARANTINE / "shard-00001" / "stranger.safetensors").exists()
    assert sorted(p.name for p in d.iterdir()) == ["manifest.json", "s1-000.safetensors", "s1-001.safetensors"]


def test_a_second_quarantine_of_the_same_name_keeps_both(filled: tuple[RunStore, RunInfo]) -> None:
    store, info = filled
    for _ in range(2):
        store.sample_path(1, "s1-001").write_bytes(b"garbage")
        assert verify_run(store, shards=[1]).bad_count == 1
        redo(store, info, 1)
    names = sorted(p.name for p in (store.root / QUARANTINE / "shard-00001").iterdir())
    assert names == ["s1-001.safetensors", "s1-001.safetensors.1"]


def test_verify_refuses_while_a_run_holds_the_directory(filled: tuple[RunStore, RunInfo]) -> None:
    store, _ = filled
    with RunLock(store.root, purpose="extract"), pytest.raises(RunLockedError, match="extract"):
        verify_run(store)
    assert verify_run(store).clean  # released


def test_verify_names_what_is_missing_when_there_is_nothing_to_verify(tmp_path: Path) -> None:
    with pytest.raises(NoStoreError, match=r"is not a store \(no prepared/manifest\.json"):
        verify_run(RunStore(tmp_path))
    store, _ = make_store(tmp_path / "run", LENGTHS)
    with pytest.raises(NoStoreError, match=r"run-typo does not exist: nothing to verify\. Did you mean `.*/run`\?"):
        verify_run(RunStore(tmp_path / "run-typo"))
    store.run_json.unlink()
    with pytest.raises(NothingExtractedError, match=r"run\.json missing: .* nothing was extracted"):
        verify_run(store)
    store, _ = make_store(tmp_path / "run", LENGTHS)
    with pytest.raises(VerifyError, match=r"shards \[7\] do not exist"):
        verify_run(store, shards=[7])


def test_a_partial_shard_is_listed_with_its_first_error_and_retried_for_its_missing_samples(tmp_path: Path) -> None:
    store, info = make_store(tmp_path / "run", [[5, 6, 7], [4, 4], [3]])
    extract_shard(store, 0, ScriptedEngine(info, fail=["s0-001"]), info)
    extract_shard(store, 1, ScriptedEngine(info, fail=["s1-000", "s1-001"]), info)
    rows = {s.shard: s for s in shard_summaries(store)}
    assert [rows[i].status for i in range(3)] == ["partial", "failed", "pending"]
    assert rows[0].first_error == "s0-001: injected failure for the test" and rows[0].missing == 1
    assert rows[2].manifest.startswith("(no manifest")
    assert [s.shard for s in failed_shards(store)] == [0, 1]
    assert failed_shards(store)[0].row()["failed samples"] == 1
    assert plan_retry_samples(store) == {0: ["s0-001"], 1: ["s1-000", "s1-001"]}  # shard 2 never started
    assert plan_retry(store, [2, 0]) == [0, 2] and missing_samples(store, 2, info) == ["s2-000"]
    with pytest.raises(ValueError, match=r"shards \[5\] do not exist; .* has shards 0..2"):
        plan_retry(store, [5])
    assert redo(store, info, 0) == [["s0-001"]]
    assert plan_retry(store) == [1]


def test_a_killed_shard_is_planned_even_when_its_files_are_all_there(filled: tuple[RunStore, RunInfo]) -> None:
    store, info = filled
    m = store.read_manifest(1)
    assert m is not None
    m.status = "running"
    store.write_manifest(m)
    assert plan_retry_samples(store) == {1: []}
    assert redo(store, info, 1) == []  # a status fix-up, no engine work
    assert plan_retry(store) == []
