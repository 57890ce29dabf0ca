"""The record of a launched server, next to its log: `<log_dir>/server.json`, and the reaping of orphans.

    write_record(path, record) / read_record(path)     atomic JSON (eagle3.store.fsio); None when absent or unreadable
    reap_orphan(path, host=...)                        stop the server a dead owner left, if it is still that server
    port_taken_message(port, ...)                      who holds a port, and the setting to change

A record exists while the server may run: written at launch (keeper and owner), completed once the server answers
(the server process), removed by `stop()` or by the keeper on its way out. One left behind means the keeper was
killed too (SIGKILL of the keeper, a reboot). A new launch into the same log directory on the same host reaps it
first: when the owner is dead and the recorded keeper or server still runs with the recorded start time and
command line in the recorded process group, that group is stopped (SIGTERM, grace, SIGKILL); a pid that now
belongs to another process is never signalled.
"""

from __future__ import annotations

import contextlib
import json
import socket
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ValidationError

from eagle3.serving import procs
from eagle3.store.fsio import atomic_write_json

RECORD_NAME = "server.json"


class ServerRecord(BaseModel):
    host: str
    port: int
    url: str
    pgid: int  # the keeper's pid: the process group of the keeper, the server and its children
    keeper: procs.ProcIdentity
    server: procs.ProcIdentity | None = None  # the server's main process, once it answered
    owner: procs.ProcIdentity  # the process that launched it (a flow run's process, a test, bench)
    flow_run_id: str | None = None
    started_at: str
    log: str

    def processes(self) -> list[procs.ProcIdentity]:
        return [self.keeper, *([self.server] if self.server is not None else [])]

    def describe(self) -> str:
        run = f", flow run {self.flow_run_id}" if self.flow_run_id else ""
        return (
            f"SGLang on {self.host}:{self.port} (process group {self.pgid}, keeper pid {self.keeper.pid}"
            + (f", server pid {self.server.pid}" if self.server else "")
            + f"), launched {self.started_at} by pid {self.owner.pid}{run}; log {self.log}"
        )


@dataclass(frozen=True)
class Reaped:
    """A record a dead owner left, and what was done about it."""

    path: Path
    record: ServerRecord
    stopped: list[procs.ProcIdentity]  # empty: none of its processes was running any more

    def describe(self) -> str:
        if self.stopped:
            pids = ", ".join(str(p.pid) for p in self.stopped)
            return f"stopped an orphaned server (its owner pid {self.record.owner.pid} is gone; pids {pids}): " + (
                self.record.describe()
            )
        return f"removed the stale record {self.path}: none of its processes runs any more ({self.record.describe()})"

    def event_payload(self) -> dict[str, object]:
        return {
            "record": str(self.path),
            "host": self.record.host,
            "port": self.record.port,
            "pgid": self.record.pgid,
            "stopped_pids": [p.pid for p in self.stopped],
            "owner_pid": self.record.owner.pid,
            "owner_flow_run_id": self.record.flow_run_id,
            "log": self.record.log,
        }


def record_path(log_dir: Path) -> Path:
    return Path(log_dir) / RECORD_NAME


def write_record(path: Path, record: ServerRecord) -> None:
    atomic_write_json(path, record.model_dump(mode="json"))


def read_record(path: Path) -> ServerRecord | None:
    try:
        return ServerRecord.model_validate(json.loads(Path(path).read_text()))
    except (OSError, ValueError, ValidationError):
        return None


def remove_record(path: Path, keeper_pid: int) -> None:
    """Remove the record if it is the one of that keeper (a later launch may have replaced it)."""
    record = read_record(path)
    if record is not None and record.keeper.pid == keeper_pid:
        with contextlib.suppress(FileNotFoundError):
            Path(path).unlink()


def reap_orphan(path: Path, *, host: str | None = None, grace_s: float = 30.0) -> Reaped | None:
    """Stop the server of the record at `path` if its owner is dead and it still runs (see the module docstring).
    None when there is no record, it is another host's, or its owner lives (that server is not ours to stop)."""
    record = read_record(path)
    if record is None or record.host != (host or socket.gethostname()) or procs.is_same(record.owner):
        return None
    stopped = procs.stop_group(record.pgid, record.processes(), grace_s=grace_s)
    with contextlib.suppress(FileNotFoundError):
        Path(path).unlink()
    return Reaped(Path(path), record, stopped)


def reap_orphans_under(run_dir: Path, *, host: str | None = None) -> list[Reaped]:
    """`reap_orphan` for every record of a run directory (<run_dir>/*/server.json and one level deeper: the
    extraction's server/, server/<host>-<port>/, the evaluation's eval/server-<label>/)."""
    out = []
    for pattern in (f"*/{RECORD_NAME}", f"*/*/{RECORD_NAME}"):
        for path in sorted(Path(run_dir).glob(pattern)):
            reaped = reap_orphan(path, host=host)
            if reaped is not None:
                out.append(reaped)
    return out


def port_taken_message(port: int, host: str, holders: list[tuple[int | None, str]], *, setting: str) -> str:
    who = "; ".join(f"pid {pid}: {cmd[:300]}" if pid is not None else cmd for pid, cmd in holders)
    return (
        f"port {port} is already in use on this host ({who}), so the SGLang server this run launches at "
        f"{host}:{port} could not listen there. Either set {setting} to a free port, or, to use the server "
        f"already there, set server.url (server.servers[].url for one of several) to http://{host}:{port} "
        "(a server launched with this run's layers and --disable-radix-cache). A server left by a killed run: "
        f'stop it (docs/operations.md, "Servers"), e.g. `kill -- -$(ps -o pgid= -p PID)`.'
    )
