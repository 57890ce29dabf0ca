"""The training index: one row per sample so the trainer can bucket by length without opening files.

index.arrow  Arrow IPC file, INDEX_SCHEMA, rows in store order (shard, then manifest order);
             schema metadata: format, fingerprint (of the store content it describes)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from eagle3.store.fsio import atomic_write_bytes

INDEX_FORMAT = "eagle3-index/1"
INDEX_SCHEMA = pa.schema(
    [
        ("shard", pa.int32()),
        ("sample_id", pa.string()),
        ("path", pa.string()),  # relative to the run directory
        ("num_tokens", pa.int32()),
        ("num_loss_tokens", pa.int32()),
    ]
)


@dataclass(frozen=True)
class IndexRow:
    shard: int
    sample_id: str
    path: str
    num_tokens: int
    num_loss_tokens: int


def write_index(path: Path, rows: list[IndexRow], fingerprint: str) -> None:
    cols = {name: [getattr(r, name) for r in rows] for name in INDEX_SCHEMA.names}
    schema = INDEX_SCHEMA.with_metadata({"format": INDEX_FORMAT, "fingerprint": fingerprint})
    table = pa.table(cols, schema=schema)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, schema) as w:
        w.write_table(table)
    atomic_write_bytes(path, sink.getvalue().to_pybytes())


def read_index(path: Path) -> pa.Table:
    """The index table (memory-mapped); raises ValueError when the file is not an eagle3 index."""
    with pa.memory_map(str(path)) as src:
        table = pa.ipc.open_file(src).read_all()
    meta = table.schema.metadata or {}
    if meta.get(b"format") != INDEX_FORMAT.encode() or table.schema.remove_metadata() != INDEX_SCHEMA:
        raise ValueError(f"{path}: not an {INDEX_FORMAT} file (schema {table.schema})")
    return table
