"""Crash-safe file writes and safe file names.

Every file the pipeline writes goes through here: temporary name in the same directory, fsync,
rename, fsync the directory. A file that exists under its final name is complete.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import IO, Any

_SAFE = re.compile(r"[^A-Za-z0-9._-]")
MAX_NAME = 160
IOV_BATCH = 512  # buffers per writev (Linux's IOV_MAX is 1024)


def safe_name(raw: str) -> str:
    """Turn an id (sample id, request id) into a file-name component that cannot leave its directory.

    Keeps [A-Za-z0-9._-], replaces anything else with '_', refuses names that are empty or only dots.
    """
    name = _SAFE.sub("_", raw)[:MAX_NAME]
    if not name.strip("."):
        raise ValueError(f"id {raw!r} cannot be used as a file name (empty or dots only after sanitising)")
    return name


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes | memoryview) -> None:
    """Write data to path so that path is either absent, the old content, or all of data."""
    atomic_write_parts(path, [data])


def atomic_write_with(path: Path, write: Callable[[IO[bytes]], Any], *, sync_dir: bool = True) -> None:
    """The one atomic-write mechanism: `write(file)` streams the content into a temporary file in the
    same directory, which is fsynced and renamed over `path` (then the directory is fsynced)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if sync_dir:
        fsync_dir(path.parent)


def atomic_write_parts(path: Path, parts: Sequence[bytes | memoryview]) -> None:
    """atomic_write_bytes of the concatenation of parts, without building it (the parts can be views
    of tensor memory). One writev for all of them: every system call releases the GIL and has to win it
    back, and in the extraction writers those waits, not the disk, had set the pace (docs/performance.md)."""

    def write(f: IO[bytes]) -> None:
        writev_all(f.fileno(), parts)

    atomic_write_with(path, write)


def writev_all(fd: int, parts: Sequence[bytes | memoryview]) -> None:
    """Write every byte of `parts` to `fd`, in as few writev calls as the kernel allows."""
    views = [memoryview(p).cast("B") for p in parts if len(p)]
    while views:
        done = os.writev(fd, views[:IOV_BATCH])
        if not done:  # a regular file reports a full disk as an error; never spin on a device that takes nothing
            raise OSError(errno.EIO, f"writev to fd {fd} wrote nothing")
        while views and done >= len(views[0]):  # a short write (a signal, > 2 GiB) resumes where it stopped
            done -= len(views[0])
            views.pop(0)
        if done:
            views[0] = views[0][done:]


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text())


def move_into(src: Path, dst: Path) -> None:
    """Move a finished file into place: rename on one filesystem, else copy + fsync + rename."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(src, dst)
    except OSError as e:
        if e.errno != 18:  # EXDEV: different filesystems
            raise
        with open(src, "rb") as inp:
            atomic_write_with(dst, lambda out: shutil.copyfileobj(inp, out, 16 << 20), sync_dir=False)
        src.unlink()
    fsync_dir(dst.parent)


def claim_keyed(manifest: Path, key: dict[str, Any], outputs: Callable[[], Iterable[Path]], temps: Path) -> None:
    """Outputs made under `key` (recorded in `manifest`) are kept; made under another key (or none), they are
    deleted and `key` recorded. Temporary files a killed writer left in `temps` go either way."""
    if not (manifest.is_file() and read_json(manifest) == key):
        for old in outputs():
            old.unlink(missing_ok=True)
        atomic_write_json(manifest, key)
    remove_stale_temps(temps)


def remove_stale_temps(directory: Path) -> int:
    """Delete temporary files left by a killed writer (names start with '.' and end with '.tmp')."""
    n = 0
    if directory.is_dir():
        for p in directory.glob(".*.tmp"):
            p.unlink(missing_ok=True)
            n += 1
    return n
