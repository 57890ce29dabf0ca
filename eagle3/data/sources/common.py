"""What every reader of eagle3/data/sources/ shares: its error, the records it lists and reads, and the sources a
data config names.

    SourceError            a source that cannot be listed or read; the message names it and the fix
    SourceFile             one listed unit (a file, or a whole source) with its content fingerprint
    RawRow                 one input row, or the reason it could not be read
    data_sources(data)     the sources of a DataConfig: `data.sources`, or the one `data.dataset` names
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3.config import DataConfig, DatasetRef, DataSource


class SourceError(ValueError):
    """A source that names nothing readable, or that cannot be read; the message names it and the fix."""


@dataclass(frozen=True)
class SourceFile:
    """One input file (or one whole source): its name as recorded (the path as listed), size and sha256 of its
    bytes (of a whole source: its fingerprint)."""

    name: str
    path: Path
    size: int
    sha256: str


@dataclass(frozen=True)
class RawRow:
    """One input row, or the reason it could not even be read (bad JSON, bad UTF-8)."""

    file: str
    row: int
    data: dict[str, Any] | None
    error: str | None = None
    origin: str | None = None  # `source` to record instead of "<file>:<row>" (synthesize keeps the original)


#: What a reader returns: (number of rows, or 0 when unknown; the rows in input order).
Rows = tuple[int, Iterator[RawRow]]


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


def chain_rows(parts: list[Rows]) -> Rows:
    """The rows of several reads, one after the other (the total is unknown if one part's is)."""
    total = 0 if any(n == 0 for n, _ in parts) else sum(n for n, _ in parts)
    return total, itertools.chain.from_iterable(rows for _, rows in parts)


def data_sources(data: DataConfig) -> list[DataSource]:
    """The sources of a DataConfig: `data.sources`, or the one its DatasetRef keys (`dataset`, `subset`, `split`,
    `revision`) name."""
    if data.sources:
        return list(data.sources)
    return [DataSource.model_validate(data.model_dump(include=set(DatasetRef.model_fields)))]
