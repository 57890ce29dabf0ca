"""A child process that never outlives the process that launched it (its owner), however the owner dies.

    proc = OwnedProcess.launch(argv, cwd=..., env=..., stdout=log, grace_s=30)   owner side
    proc.pid / proc.pgid     the keeper, which leads the process group of everything it runs
    proc.poll()              None while the child runs; then the child's exit code (128+N: killed by signal N)
    proc.stop()              end the whole group: SIGTERM, `grace_s`, SIGKILL; safe to call twice

    owner ──pipe──▶ keeper (own session + process group) ──▶ child (argv; same group)
                                                               └─▶ its children (SGLang: scheduler, detokenizer)

Why a keeper: PR_SET_PDEATHSIG fires when the *thread* that forked the child exits, not its process, and Prefect
runs tasks in worker threads; a server launched from one task and used by the next would be killed when the first
task's thread ends. So the owner holds the write end of a pipe instead (a process's file descriptors close when it
dies, even by SIGKILL), and the keeper, a small single-threaded Python process, ends the group when:

* the owner calls `stop()` (it writes STOP to the pipe, then closes it): SIGTERM, up to `grace_s`, SIGKILL;
* the pipe reaches EOF: the owner exited or was killed: SIGTERM, ORPHAN_GRACE_S, SIGKILL;
* the owner's pid no longer runs the owner (start time differs): a forked copy of the owner may hold the pipe;
* it gets SIGTERM, SIGINT or SIGHUP (an operator's `kill` of the keeper, a `kill -- -PGID` of the group);
* the child exits by itself: then only its stragglers are killed, and the keeper exits with the child's code.

Ending = SIGTERM to the group, a grace period for it to go, then SIGKILL to whatever is left in the group and
below the keeper (it is a child subreaper, so orphaned descendants that left the group are still found). The
child gets PR_SET_PDEATHSIG=SIGKILL from the keeper's only thread: if the keeper itself is SIGKILLed, the child
dies, and SGLang's own children die with it (they set PR_SET_PDEATHSIG on their parent). A record file, when
given, is removed by the keeper on its way out if it still names this keeper (eagle3/serving/record.py).

The keeper runs with the owner's interpreter in isolated mode (`-I`: no PYTHON* variables, no script or working
directory on sys.path), importing only this module, eagle3.serving.procs and eagle3.lifetime (standard library).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

from eagle3.lifetime import become_subreaper, die_with_parent
from eagle3.serving import procs

POLL_S = 1.0  # how often the keeper checks its owner's pid (the pipe and signals wake it at once)
ORPHAN_GRACE_S = 3.0  # SIGTERM to SIGKILL when the owner died (SGLang itself takes ~5 s to end on SIGTERM)
STOP = b"s"  # written by the owner's stop() before it closes the pipe
ROOT = Path(__file__).resolve().parents[2]  # the directory holding the eagle3 package the keeper imports
_BOOT = (
    "import sys; sys.path.insert(0, sys.argv[1]); from eagle3.serving.keeper import main; sys.exit(main(sys.argv[2:]))"
)


def keeper_argv(
    argv: list[str], *, owner: procs.ProcIdentity, fd: int, grace_s: float, record: Path | None
) -> list[str]:
    return [
        sys.executable, "-I", "-c", _BOOT, str(ROOT),
        str(owner.pid), str(owner.start_ticks), str(fd), str(grace_s), str(record or ""), "--", *argv,
    ]  # fmt: skip


class OwnedProcess:
    """A launched keeper and its child (see the module docstring)."""

    def __init__(self, proc: subprocess.Popen[bytes], pipe_w: int | None, grace_s: float):
        self.proc, self._pipe_w, self.grace_s = proc, pipe_w, grace_s

    @classmethod
    def launch(
        cls,
        argv: list[str],
        *,
        cwd: Path,
        env: dict[str, str],
        stdout: IO[bytes] | int | None,
        grace_s: float = 30.0,
        record: Path | None = None,
    ) -> OwnedProcess:
        owner = procs.identity(os.getpid())
        assert owner is not None, "/proc does not show this process"
        r, w = os.pipe()  # both ends close-on-exec: only the keeper gets `r` (pass_fds), no other child gets `w`
        try:
            proc = subprocess.Popen(
                keeper_argv(argv, owner=owner, fd=r, grace_s=grace_s, record=record),
                cwd=cwd,
                env=env,
                stdout=stdout,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                pass_fds=(r,),
                start_new_session=True,  # its own process group (pgid = keeper pid), out of the owner's terminal
            )
        except BaseException:
            os.close(w)
            raise
        finally:
            os.close(r)
        return cls(proc, w, grace_s)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def pgid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self.proc.wait(timeout)

    def stop(self) -> None:
        """Close the pipe (the keeper ends the group: SIGTERM, grace, SIGKILL) and wait until every process of the
        group is gone (also when the keeper was killed with it: processes that die with a lot of memory take
        a while to exit); SIGKILL what is left if the keeper does not finish in time."""
        if self._pipe_w is not None:
            with contextlib.suppress(OSError):  # the keeper is gone already (EPIPE)
                os.write(self._pipe_w, STOP)
            os.close(self._pipe_w)
            self._pipe_w = None
        try:
            self.proc.wait(self.grace_s + 15)
        except subprocess.TimeoutExpired:
            procs.signal_group(self.pgid, signal.SIGKILL)
            self.proc.wait(30)
        deadline = time.monotonic() + 15.0
        while procs.group_members(self.pgid) and time.monotonic() < deadline:
            procs.signal_group(self.pgid, signal.SIGKILL)  # stragglers of a keeper that was killed with its group
            time.sleep(0.1)


# the keeper process --------------------------------------------------------------------------------------------------
_stop_signal: list[int] = []


def _on_signal(sig: int, _frame: object) -> None:
    _stop_signal.append(sig)


def _others(me: int) -> list[int]:
    """Live processes of my group, and my descendants wherever they went (not me, not zombies)."""
    found = set(procs.group_members(me)) | set(procs.descendants(me))
    return sorted(p for p in found if p != me and not procs.is_zombie(p))


def _kill_others(me: int) -> None:
    for _ in range(20):
        left = _others(me)
        if not left:
            return
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def _end_group(me: int, child: subprocess.Popen[bytes], grace_s: float) -> None:
    procs.signal_group(me, signal.SIGTERM)  # reaches me too: the handler only notes it
    for pid in procs.descendants(me):  # those that left the group (a setsid in a child)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        child.poll()
        _reap_orphans(me, child.pid)
        if child.returncode is not None and not _others(me):
            return
        time.sleep(0.1)
    _kill_others(me)


def _reap_orphans(me: int, child: int) -> None:
    """As a subreaper, collect the exit status of adopted descendants (not the child's: Popen owns that one)."""
    for pid in procs.pids():
        if pid != child and procs.parent(pid) == me and procs.is_zombie(pid):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


def _remove_record(record: str, me: int) -> None:
    if not record:
        return
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        if json.loads(Path(record).read_text())["keeper"]["pid"] == me:
            Path(record).unlink()


def main(args: list[str]) -> int:
    sep = args.index("--")
    owner_pid, owner_start, fd, grace_s, record = args[:sep]
    argv = args[sep + 1 :]
    me = os.getpid()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    become_subreaper()

    def arm() -> None:  # in the child, before exec: die with the keeper (its only thread forks it)
        die_with_parent(signal.SIGKILL)
        if os.getppid() != me:
            os._exit(1)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)

    # Signals (a child's exit, SIGTERM) wake the loop at once through this pipe; otherwise it sleeps POLL_S.
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    if procs.start_ticks(int(owner_pid)) != int(owner_start):  # the owner died before we got here
        return 1
    child = subprocess.Popen(argv, preexec_fn=arm)  # preexec_fn is safe: the keeper has one thread
    pipe = int(fd)
    grace: float | None = None  # set when the group is to end: how long it may take before SIGKILL
    while child.poll() is None and grace is None:
        if _stop_signal:
            grace = float(grace_s)
            break
        ready, _, _ = select.select([pipe, wake_r], [], [], POLL_S)
        if wake_r in ready:
            os.read(wake_r, 4096)
            _reap_orphans(me, child.pid)
        if pipe in ready:
            data = os.read(pipe, 64)
            # STOP first: the owner's stop(), a graceful end; EOF alone: the owner died, nobody waits for
            # answers, so the group gets ORPHAN_GRACE_S (the port and the GPUs are free within seconds).
            grace = float(grace_s) if STOP in data else ORPHAN_GRACE_S if not data else None
        if grace is None and procs.start_ticks(int(owner_pid)) != int(owner_start):
            grace = ORPHAN_GRACE_S
    if grace is not None:
        _end_group(me, child, grace)
    else:
        _kill_others(me)  # the child exited on its own: its stragglers go with it
    child.wait()
    _reap_orphans(me, child.pid)
    _remove_record(record, me)
    code = child.returncode
    return 128 - code if code < 0 else code
