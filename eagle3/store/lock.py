"""Files held by one live process: the run directory's lock (`RunLock`) and, built on the same mechanism,
shard leases (eagle3/store/lease.py).

    <run_dir>/.lock        exists while a run holds the directory; JSON owner {host, pid, started_at, token, ...}
    live_leases(run_dir)   the shard leases (<run_dir>/leases/, eagle3/store/lease.py) a live process holds;
                           here, not in lease.py, so that RunLock can check them and lease.py imports only this

Design (docs/operations.md, "Two runs on one run directory"; docs/multinode.md for leases):
* Acquire = create the file exclusively. The owner JSON is written and fsynced to a temporary file first and
  hard-linked to the name (link fails if the name exists, atomically, also on NFS), so a held file that exists
  is always complete. Where hard links are not supported, O_CREAT|O_EXCL is used instead.
* The holder keeps `flock(LOCK_EX)` on the file for as long as it holds it. The kernel drops that lock when
  the process dies, however it dies, so on one host a contender tells a live holder from a dead one exactly:
  if it can take the flock, nobody holds it (pid reuse cannot fool this, unlike a pid check).
* The holder touches the file every `heartbeat_s` seconds. A file from another host (shared storage, where
  flock may not reach) is stale once its mtime is older than the TTL (the owner's `ttl_s` when it recorded
  one, else the contender's); clocks must roughly agree (NTP).
* Takeover of a stale file happens under flock on the directory that holds it (no helper file is left behind:
  a directory is never removed, so two takers always lock the same thing): re-read the file, and only if it is
  still the same owner (token) and still stale, remove it; then create it exclusively like anyone else. Two
  takers are serialised, and the second finds a different token and judges afresh, so two can never both win.
  Where a directory cannot be flock'd (NFS), the token check alone stands, as on another host.
* The heartbeat also checks that the file still holds this owner's token; if not (taken over after a long
  stall), `check()` raises the holder's "lost" error so it stops writing.

The run lock comes in two kinds (`exclusive`): an exclusive one (extract, retry, verify) keeps every other
run out, shard leases of other runs included; a shared one (`exclusive=False`) is the short run-level guard
of flow runs that extract one run directory together (only while they write run.json), and waits for
another shared holder instead of refusing.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import secrets
import socket
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType

from eagle3.store.fsio import fsync_dir
from eagle3.store.paths import RunPaths

LOCK_NAME = ".lock"
DEFAULT_TTL_S = 600.0
DEFAULT_HEARTBEAT_S = 30.0
_NO_LINK = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK, errno.ENOSYS}
_NO_FLOCK = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EINVAL}


@dataclass(frozen=True)
class LockOwner:
    host: str
    pid: int
    started_at: str  # ISO time, UTC
    token: str  # random; tells two holders apart even with one host and pid
    purpose: str  # "extract", "verify", "retry", "open-run", "extract shard 3", ...
    flow_run_id: str | None = None
    ttl_s: float | None = None  # the holder's promise: stale once the file's mtime is older than this
    exclusive: bool = True  # a run lock that keeps other runs (and their shard leases) out

    def describe(self) -> str:
        run = f", flow run {self.flow_run_id}" if self.flow_run_id else ""
        return f"pid {self.pid} on host {self.host} ({self.purpose}{run}) since {self.started_at}"


@dataclass(frozen=True)
class LockState:
    """What a held file says about who holds it (for `eagle3 status` and the error messages)."""

    owner: LockOwner | None  # None: the file is unreadable (being created, or damaged)
    heartbeat_age_s: float
    stale: str | None  # why the file is stale, or None when its holder is alive
    ttl_s: float = DEFAULT_TTL_S  # the TTL it was judged with

    def describe(self) -> str:
        who = self.owner.describe() if self.owner else "an unknown owner (unreadable lock file)"
        state = f"stale: {self.stale}" if self.stale else "alive"
        return f"{who}; last heartbeat {self.heartbeat_age_s:.0f} s ago; {state}"

    @property
    def expires_in_s(self) -> float:
        """Seconds until another host may take it over without a heartbeat (0 when already stale)."""
        return 0.0 if self.stale else max(0.0, self.ttl_s - self.heartbeat_age_s)


class RunLockedError(RuntimeError):
    """Another live run holds the run directory (or, for an exclusive lock, a shard lease in it)."""

    def __init__(self, path: Path, state: LockState, ttl_s: float, *, run_dir: Path | None = None):
        self.path, self.state = path, state
        run_dir = run_dir or path.parent
        what = "locked" if path.name == LOCK_NAME else f"shard lease {path.name} held"
        super().__init__(
            f"{run_dir} is in use: {what} by {state.describe()}. Two runs writing one store would race on "
            "its manifests; wait for that run to finish, or stop it (`eagle3 status RUN_DIR` shows the holder). "
            f"A lock left by a killed run is taken over automatically: at once on the same host, after {ttl_s:.0f} s "
            f"without a heartbeat from another host. If you are sure no run uses the directory, delete {path}."
        )


class RunLockLostError(RuntimeError):
    """This process held the lock, but `.lock` now names another owner (it was judged stale and taken over)."""


def _hostname() -> str:
    return socket.gethostname()


def _now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _try_flock(fd: int) -> bool | None:
    """True: took the exclusive flock; False: someone holds it; None: this filesystem has no flock."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    except OSError as e:
        if e.errno in _NO_FLOCK:
            return None
        raise


def _try_flock_dir(fd: int) -> bool | None:
    """`_try_flock` on a directory; None where the filesystem cannot lock one (NFS emulates flock with POSIX
    locks, which need a file open for writing: EBADF)."""
    try:
        return _try_flock(fd)
    except OSError:
        return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_owner(path: Path) -> LockOwner | None:
    """The owner recorded in a held file; None when it is unreadable. Raises FileNotFoundError when absent."""
    try:
        return LockOwner(**json.loads(Path(path).read_text()))
    except (json.JSONDecodeError, TypeError, UnicodeDecodeError):
        return None


def judge(path: Path, ttl_s: float = DEFAULT_TTL_S, host: str | None = None) -> LockState:
    """Is the file at `path` held by a live process? Raises FileNotFoundError when there is none."""
    owner = read_owner(path)
    age = max(0.0, time.time() - path.stat().st_mtime)
    ttl = owner.ttl_s if owner is not None and owner.ttl_s is not None else ttl_s
    here = host or _hostname()
    stale: str | None = None
    if owner is not None and owner.host == here:
        fd = os.open(path, os.O_RDWR)
        try:
            free = _try_flock(fd)
        finally:
            os.close(fd)  # also drops the test lock
        if free is True:
            stale = f"no live process holds it (pid {owner.pid} is {'alive' if _pid_alive(owner.pid) else 'gone'})"
        elif free is None and not _pid_alive(owner.pid):
            stale = f"pid {owner.pid} is gone"
    elif age > ttl:
        stale = f"no heartbeat for {age:.0f} s (TTL {ttl:.0f} s)"
    return LockState(owner, age, stale, ttl)


def lock_state(run_dir: str | Path, ttl_s: float = DEFAULT_TTL_S) -> LockState | None:
    """Who holds `run_dir`, or None when nobody does."""
    try:
        return judge(Path(run_dir) / LOCK_NAME, ttl_s)
    except FileNotFoundError:
        return None


class HeldFile:
    """A file that one live process holds (create-exclusive, flock, heartbeat, stale takeover).

    `try_acquire()` returns False when a live owner holds it; subclasses turn that into their own error."""

    lost_error: type[Exception] = RunLockLostError

    def __init__(
        self,
        path: Path,
        *,
        purpose: str,
        flow_run_id: str | None = None,
        ttl_s: float = DEFAULT_TTL_S,
        heartbeat_s: float = DEFAULT_HEARTBEAT_S,
        host: str | None = None,
        exclusive: bool = True,
        record_ttl: bool = False,
    ):
        if heartbeat_s * 3 > ttl_s:
            raise ValueError(f"heartbeat_s={heartbeat_s} must be at most a third of ttl_s={ttl_s}")
        self.path = Path(path)
        self.ttl_s, self.heartbeat_s = ttl_s, heartbeat_s
        self.owner = LockOwner(
            host=host or _hostname(),
            pid=os.getpid(),
            started_at=_now_iso(),
            token=secrets.token_hex(8),
            purpose=purpose,
            flow_run_id=flow_run_id,
            ttl_s=ttl_s if record_ttl else None,
            exclusive=exclusive,
        )
        self.took_over: LockState | None = None  # the stale file this one replaced, if any
        self.lost: str | None = None
        self._fd: int | None = None
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def state(self) -> LockState | None:
        """Who holds the file now (None: nobody)."""
        try:
            return judge(self.path, self.ttl_s, self.owner.host)
        except FileNotFoundError:
            return None

    def try_acquire(self) -> bool:
        """Hold the file: True when this owner now holds it (a stale one taken over); False when a live owner does."""
        if self.held:
            raise RuntimeError(f"{self.path}: already held by this object")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(5):
            if self._create():
                self._start_heartbeat()
                return True
            state = self.state()
            if state is None:
                continue  # released meanwhile: try again
            if state.stale is None:
                return False
            self._break(state)
        return False

    def release(self) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
            self._beat = None
        if self._fd is None:
            return
        try:
            if self._still_mine():
                self.path.unlink()
                fsync_dir(self.path.parent)
        finally:
            os.close(self._fd)  # drops the flock
            self._fd = None

    def check(self) -> None:
        """Raise `lost_error` if another process took this file over (call between units of work)."""
        if self.lost is not None:
            raise self.lost_error(f"{self.path}: this process no longer holds it: {self.lost}")

    # internals ----------------------------------------------------------------------------
    def _create(self) -> bool:
        """Create the file holding our owner JSON, exclusively. False when it exists."""
        data = (json.dumps(asdict(self.owner)) + "\n").encode()
        tmp = self.path.with_name(f"{self.path.name}.{self.owner.token}.tmp")
        tmp = tmp.with_name("." + tmp.name.lstrip("."))
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
        linked = False
        try:
            os.write(fd, data)
            os.fsync(fd)
            _try_flock(fd)  # held before the name appears: a contender never sees an unlocked live file
            try:
                os.link(tmp, self.path)
                linked = True
            except FileExistsError:
                return False
            except OSError as e:
                if e.errno not in _NO_LINK:
                    raise
        finally:
            tmp.unlink(missing_ok=True)
            if not linked:
                os.close(fd)
        if not linked:
            return self._create_excl(data)
        self._fd = fd
        fsync_dir(self.path.parent)
        return True

    def _create_excl(self, data: bytes) -> bool:
        """Fallback for filesystems without hard links. A reader may briefly see an empty file."""
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
        except FileExistsError:
            return False
        _try_flock(fd)
        os.write(fd, data)
        os.fsync(fd)
        self._fd = fd
        fsync_dir(self.path.parent)
        return True

    def _break(self, state: LockState) -> None:
        """Remove the stale file described by `state`, unless it changed meanwhile (then the caller re-judges)."""
        fd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            deadline = time.monotonic() + 30.0
            while _try_flock_dir(fd) is False:  # None (no flock here): go on without; the token check still holds
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{self.path.parent}: another process is taking over {self.path}")
                time.sleep(0.05)
            now = self.state()
            if now is None:
                return
            same = (now.owner is None and state.owner is None) or (
                now.owner is not None and state.owner is not None and now.owner.token == state.owner.token
            )
            if same and now.stale is not None:
                self.path.unlink()
                fsync_dir(self.path.parent)
                self.took_over = now
        finally:
            os.close(fd)

    def _still_mine(self) -> bool:
        try:
            owner = read_owner(self.path)
        except FileNotFoundError:
            return False
        return owner is not None and owner.token == self.owner.token

    def _start_heartbeat(self) -> None:
        self._stop.clear()
        self._beat = threading.Thread(target=self._heartbeat, daemon=True, name=f"heartbeat-{self.path.name}")
        self._beat.start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                if not self._still_mine():
                    state = self.state()
                    self.lost = f"now held by {state.describe()}" if state else f"{self.path} was removed"
                    return
                os.utime(self.path)
            except OSError:  # a storage hiccup: keep trying; the TTL is several heartbeats long
                continue


class RunLock(HeldFile):
    """A hold on a run directory for one process. Use as a context manager, or acquire()/release().

    exclusive (the default): RunLockedError when another live run holds the directory or a shard lease in it.
    shared (`exclusive=False`, the guard of cooperating flow runs while they write run.json): waits up to
    `wait_s` for another shared holder; refuses an exclusive one at once."""

    def __init__(
        self,
        run_dir: str | Path,
        *,
        purpose: str = "extract",
        flow_run_id: str | None = None,
        ttl_s: float = DEFAULT_TTL_S,
        heartbeat_s: float = DEFAULT_HEARTBEAT_S,
        host: str | None = None,
        exclusive: bool = True,
        wait_s: float = 0.0,
    ):
        self.run_dir = Path(run_dir)
        self.wait_s = wait_s
        super().__init__(
            self.run_dir / LOCK_NAME,
            purpose=purpose,
            flow_run_id=flow_run_id,
            ttl_s=ttl_s,
            heartbeat_s=heartbeat_s,
            host=host,
            exclusive=exclusive,
        )

    # context manager ----------------------------------------------------------------------
    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.release()

    def acquire(self) -> RunLock:
        if self.held:
            raise RuntimeError(f"{self.path}: this RunLock is already held")
        deadline = time.monotonic() + self.wait_s
        while not self.try_acquire():
            state = self.state()
            if state is None:
                continue  # the holder released between our attempt and this look: try again
            shared_holder = state.owner is not None and not state.owner.exclusive
            if self.owner.exclusive or not shared_holder or time.monotonic() > deadline:
                raise RunLockedError(self.path, state, self.ttl_s)
            time.sleep(0.2)
        if self.owner.exclusive:
            self._refuse_live_leases()
        return self

    def _refuse_live_leases(self) -> None:
        """An exclusive holder must not share the directory with another run's shard leases (they check
        `.lock` after taking a lease, this checks the leases after taking `.lock`: one of two racers sees the other)."""
        live = live_leases(self.run_dir, host=self.owner.host)
        if live:
            path, state = live[0]
            self.release()
            raise RunLockedError(path, state, self.ttl_s, run_dir=self.run_dir)


def live_leases(run_dir: str | Path, host: str | None = None) -> list[tuple[Path, LockState]]:
    """(path, state) of every shard lease in `run_dir` that a live process holds, in shard order."""
    out = []
    for path in RunPaths(run_dir).lease_paths():
        try:
            state = judge(path, DEFAULT_TTL_S, host)
        except FileNotFoundError:
            continue
        if state.stale is None:
            out.append((path, state))
    return out
