"""The disk probe the extraction benches hold their writes against: fsynced atomic writes, as the store does them."""

from __future__ import annotations

import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from eagle3.store.fsio import atomic_write_bytes


def write_bandwidth(directory: Path, total: int, file_size: int, threads: int) -> float:
    """bytes/s of fsynced atomic writes of `file_size`-byte files, `total` bytes in all, from `threads`
    threads (as many as the extraction's writers, so both ask the disk the same way)."""
    directory.mkdir(parents=True, exist_ok=True)
    payload = os.urandom(file_size)
    n = max(threads, total // file_size)
    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda i: atomic_write_bytes(directory / f"f{i:05d}.bin", payload), range(n)))
    seconds = time.perf_counter() - start
    shutil.rmtree(directory)
    return n * file_size / seconds
