"""Processes of this host as /proc (Linux) shows them: who a pid is, who listens on a port, a process group.

    identity(pid)              ProcIdentity(pid, start_ticks, cmdline), or None when there is no such process
    is_same(ident)             that pid still runs the very process recorded (start time and command line agree)
    group_members(pgid)        pids in a process group;  descendants(pid): its children, theirs, ...
    signal_group(pgid, sig)    a signal to every process of a group (no error when it is gone)
    stop_group(pgid, members)  SIGTERM then SIGKILL to a group, only if a recorded member still runs in it
    port_holders(port)         who listens on a TCP port: (pid, cmdline), pid None where /proc does not say

A pid alone names a process only while it lives: the kernel reuses pids. The start time (clock ticks since boot,
field 22 of /proc/<pid>/stat) together with the command line is what tells "still that server" from "a new process
that got its pid". Standard library only: eagle3/serving/keeper.py imports it in a bare interpreter.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
LISTEN = "0A"  # TCP state in /proc/net/tcp


@dataclass(frozen=True)
class ProcIdentity:
    pid: int
    start_ticks: int  # since boot; differs for a later process that reuses the pid
    cmdline: tuple[str, ...]

    def command(self, limit: int = 300) -> str:
        line = " ".join(self.cmdline) or "(no command line: a kernel thread or a zombie)"
        return line if len(line) <= limit else line[:limit] + " ..."


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (which may hold spaces and parentheses)."""
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except (OSError, ValueError):
        return None
    return raw[raw.rfind(")") + 2 :].split()


def start_ticks(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[19]) if fields is not None else None  # field 22 of stat; 20th after "pid (comm)"


def parent(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[1]) if fields is not None else None


def process_group(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[2]) if fields is not None else None


def descendants(root: int) -> list[int]:
    """Children of `root`, their children, and so on (by parent pid, wherever their process group is)."""
    children: dict[int, list[int]] = {}
    for pid in pids():
        fields = _stat_fields(pid)
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(pid)
    out, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def is_zombie(pid: int) -> bool:
    fields = _stat_fields(pid)
    return fields is not None and fields[0] == "Z"


def cmdline(pid: int) -> tuple[str, ...]:
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return ()
    return tuple(a.decode(errors="replace") for a in raw.split(b"\0") if a)


def identity(pid: int) -> ProcIdentity | None:
    start = start_ticks(pid)
    if start is None:
        return None
    return ProcIdentity(pid, start, cmdline(pid))


def is_same(ident: ProcIdentity) -> bool:
    """The pid still runs the process of `ident` (a zombie counts as gone)."""
    now = identity(ident.pid)
    return (
        now is not None
        and now.start_ticks == ident.start_ticks
        and now.cmdline == ident.cmdline
        and not (is_zombie(ident.pid))
    )


def pids() -> list[int]:
    return [int(d.name) for d in PROC.iterdir() if d.name.isdigit()]


def group_members(pgid: int) -> list[int]:
    return [pid for pid in pids() if process_group(pid) == pgid and not is_zombie(pid)]


def signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (PROC / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def port_holders(port: int) -> list[tuple[int | None, str]]:
    """(pid, command line) of each process listening on TCP `port` on any address; (None, why) for a listening
    socket whose process /proc does not show (another user's: only root may read its file descriptors)."""
    inodes = _listening_inodes(port)
    if not inodes:
        return []
    found: dict[int, str] = {}
    seen: set[str] = set()
    for pid in pids():
        try:
            fds = list((PROC / str(pid) / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                seen.add(target[8:-1])
                found[pid] = " ".join(cmdline(pid))
    out: list[tuple[int | None, str]] = sorted(found.items())
    if inodes - seen:
        out.append((None, "a process this user cannot inspect (another user's; `sudo ss -ltnp` names it)"))
    return out


def stop_group(pgid: int, members: list[ProcIdentity], *, grace_s: float = 10.0) -> list[ProcIdentity]:
    """SIGTERM, then SIGKILL after `grace_s`, to process group `pgid`, only if one of `members` (the processes
    recorded in it) still runs there. Returns those found (empty: nothing was signalled, the group is gone or its
    pids now belong to other processes)."""
    alive = [m for m in members if is_same(m) and process_group(m.pid) == pgid]
    if not alive:
        return []
    signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.2)
    signal_group(pgid, signal.SIGKILL)
    deadline = time.monotonic() + 10.0
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive
