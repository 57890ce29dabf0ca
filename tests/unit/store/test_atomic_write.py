"""fsio's atomic writes of several parts: every byte lands, in order, even when the kernel writes only part."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from eagle3.store import fsio


def parts() -> list[bytes | memoryview]:
    rng = np.random.default_rng(0)
    arrays = [rng.integers(0, 256, n, dtype=np.uint8) for n in (7, 0, 4096, 1, 70_000)]
    return [b"header", *(a.data for a in arrays), np.arange(6, dtype=np.int64).data]


def test_all_parts_are_written_in_order_in_one_file(tmp_path: Path) -> None:
    path = tmp_path / "d" / "sample.safetensors"
    fsio.atomic_write_parts(path, parts())
    assert path.read_bytes() == b"".join(bytes(p) for p in parts())
    assert [p.name for p in path.parent.iterdir()] == ["sample.safetensors"]  # no temporary left


def test_short_writes_resume_where_the_kernel_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.writev
    calls: list[int] = []

    def at_most_1000_bytes(fd: int, buffers: list[memoryview]) -> int:  # a kernel that writes short every time
        out, left = [], 1000
        for b in buffers:
            out.append(b[:left])
            left -= len(out[-1])
            if not left:
                break
        calls.append(len(buffers))
        return real(fd, out)

    monkeypatch.setattr(fsio.os, "writev", at_most_1000_bytes)
    monkeypatch.setattr(fsio, "IOV_BATCH", 2)  # and never more than two buffers per call
    path = tmp_path / "sample.bin"
    fsio.atomic_write_parts(path, parts())
    assert path.read_bytes() == b"".join(bytes(p) for p in parts())
    assert max(calls) == 2 and len(calls) >= sum(len(p) for p in parts()) // 1000


def test_a_write_that_takes_nothing_fails_and_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fsio.os, "writev", lambda fd, buffers: 0)
    with pytest.raises(OSError, match="wrote nothing"):
        fsio.atomic_write_parts(tmp_path / "sample.bin", parts())
    assert list(tmp_path.iterdir()) == []  # neither the file nor its temporary
