"""A process that ends with the process that started it (Linux's prctl; a no-op elsewhere).

    die_with_parent(sig)   ask the kernel for `sig` when the *thread* that forked this process exits
    become_subreaper()     orphaned descendants are re-parented to this process, not to init

Standard library only: eagle3/serving/keeper.py imports it in a bare interpreter, eagle3/train/launch.py and the
torchrun worker in theirs.
"""

from __future__ import annotations

import ctypes
import signal
import sys

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, arg: int) -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(option, arg, 0, 0, 0)


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask Linux to send `sig` to this process when the thread that started it exits (no-op elsewhere)."""
    _prctl(PR_SET_PDEATHSIG, sig)


def become_subreaper() -> None:
    """Orphaned descendants of this process become its children (so it can still find and end them)."""
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
