"""A directory installed whole or not at all: the demo model and the tiny targets are built in a temporary directory
beside their place and renamed into it."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from eagle3.store.fsio import fsync_dir


@contextmanager
def installing(target: Path) -> Iterator[Path]:
    """An empty directory beside `target` to fill. When the block ends it replaces `target` (renamed into place, the
    parent directory synced); when the block raises it is removed and `target` is not touched."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
    try:
        yield tmp
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
        fsync_dir(target.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
