"""A shard manifest lists its samples in prepared order, whatever order the engine and writers finish in, so
the convert index, its fingerprint and the trainer's batches are the same on every run."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

from eagle3.extract.engines.base import Outcome
from eagle3.extract.shard import extract_shard
from eagle3.store.run_store import PreparedSample
from tests.unit.tiny_store import ScriptedEngine, make_store


class ReversedEngine(ScriptedEngine):
    """Yields each batch's outcomes last first (an engine with several requests in flight does this)."""

    def extract(self, samples: Sequence[PreparedSample]) -> Iterator[Outcome]:
        yield from reversed(list(super().extract(samples)))


def test_the_manifest_is_in_prepared_order_when_outcomes_arrive_reversed(tmp_path: Path) -> None:
    store, info = make_store(tmp_path, [[5, 9, 3, 7, 4, 6]])
    prepared = store.prepared_ids(0)
    engine = ReversedEngine(info, fail=[prepared[2]])
    manifest = extract_shard(store, 0, engine, info, writer_threads=3)
    assert list(manifest.samples) == [i for i in prepared if i != prepared[2]]
    assert list(manifest.errors) == [prepared[2]]
    on_disk = store.read_manifest(0)
    assert on_disk is not None and list(on_disk.samples) == list(manifest.samples)
