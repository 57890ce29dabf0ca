"""Shard leases: at most one live process extracts a shard at a time, across processes and hosts.

    <run_dir>/leases/shard-00000.lease         exists while a process extracts shard 0; JSON owner {host, pid,
                                               started_at, token, purpose, flow_run_id, ttl_s}

A lease is an eagle3.store.lock.HeldFile: taken atomically (a complete temporary file hard-linked to the name),
flock'd by its holder, touched every `heartbeat_s`. It expires `ttl_s` after the last touch (the file's mtime;
`ttl_s` is recorded in the file): a holder on another host that stopped beating is taken over after that; on
the same host a dead holder is taken over at once (nobody holds the flock). A finished shard is never redone:
the shard's files and manifest say it is complete, and extraction checks that after taking the lease.

Leases and the run lock exclude each other: a lease taken while another run holds `.lock` exclusively is
given back at once (RunLockedError), and an exclusive `.lock` refuses while another run holds a live lease.
A lease taken `under` this process's own exclusive lock is allowed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from eagle3.store.lock import (
    DEFAULT_HEARTBEAT_S,
    DEFAULT_TTL_S,
    LOCK_NAME,
    HeldFile,
    LockState,
    RunLock,
    RunLockedError,
    judge,
)
from eagle3.store.paths import RunPaths


class ShardLeaseLostError(RuntimeError):
    """This process held a shard's lease, but another process took it over (this one stalled past the TTL)."""


def lease_path(run_dir: str | Path, shard: int) -> Path:
    return RunPaths(run_dir).lease_path(shard)


class ShardLease(HeldFile):
    """The lease on one shard of one run directory.

    lease = ShardLease(run_dir, 3, flow_run_id=...)
    if lease.try_acquire():      # False: a live owner has it (lease.state() says who)
        try: ... lease.check() before each write ...
        finally: lease.release()
    """

    lost_error = ShardLeaseLostError

    def __init__(
        self,
        run_dir: str | Path,
        shard: int,
        *,
        flow_run_id: str | None = None,
        ttl_s: float = DEFAULT_TTL_S,
        heartbeat_s: float = DEFAULT_HEARTBEAT_S,
        host: str | None = None,
        under: RunLock | None = None,
    ):
        self.run_dir = Path(run_dir)
        self.shard = shard
        self.under = under
        super().__init__(
            lease_path(run_dir, shard),
            purpose=f"extract shard {shard}",
            flow_run_id=flow_run_id,
            ttl_s=ttl_s,
            heartbeat_s=heartbeat_s,
            host=host,
            record_ttl=True,
        )

    def __enter__(self) -> ShardLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def try_acquire(self) -> bool:
        """True: held now. False: a live owner holds it. RunLockedError: another run holds the run directory
        exclusively (this lease is given back first)."""
        if not super().try_acquire():
            return False
        exclusive = self._exclusive_run_lock()
        if exclusive is not None:
            self.release()
            raise RunLockedError(self.run_dir / LOCK_NAME, exclusive, self.ttl_s)
        return True

    def wait_acquire(self, timeout_s: float, *, poll_s: float = 1.0, give_up: Callable[[], bool] | None = None) -> bool:
        """Try until held (True), or until `give_up()` says so or `timeout_s` passed (False)."""
        deadline = time.monotonic() + timeout_s
        while not self.try_acquire():
            if (give_up is not None and give_up()) or time.monotonic() + poll_s > deadline:
                return False
            time.sleep(poll_s)
        return True

    def _exclusive_run_lock(self) -> LockState | None:
        """The run lock's state when another live run holds the run directory exclusively."""
        try:
            state = judge(self.run_dir / LOCK_NAME, self.ttl_s, self.owner.host)
        except FileNotFoundError:
            return None
        if state.stale is not None:
            return None
        if state.owner is not None and not state.owner.exclusive:
            return None  # a cooperating flow run writing run.json
        if self.under is not None and state.owner is not None and state.owner.token == self.under.owner.token:
            return None  # our own run's lock
        return state
