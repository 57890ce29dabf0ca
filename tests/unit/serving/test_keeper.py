"""Owner-bound processes (eagle3/serving/keeper.py), server records and orphan reaping (eagle3/serving/record.py),
and the port-taken error, with real processes (sleep, a listening Python) standing in for SGLang, which the integration
and e2e tests use (tests/integration/test_server_owner.py, tests/e2e/test_server_owner_flow.py)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from eagle3.config import ServerConfig
from eagle3.serving import procs
from eagle3.serving.keeper import OwnedProcess
from eagle3.serving.record import ServerRecord, read_record, reap_orphan, write_record
from eagle3.serving.server import ServerError, SGLangServer

REPO = Path(__file__).resolve().parents[3]
SGLANG_PYTHON = REPO / ".venv-sglang" / "bin" / "python"
# A child that starts a grandchild in the group and one that leaves it (setsid): both must go with the owner.
FAMILY = (
    "import subprocess, time, os; subprocess.Popen(['sleep', '1000']); "
    "subprocess.Popen(['sleep', '1001'], start_new_session=True); print('up', flush=True); time.sleep(1000)"
)
_OWNER = textwrap.dedent(
    """
    import os, sys, threading, time
    sys.path.insert(0, sys.argv[1])
    from eagle3.serving.keeper import OwnedProcess
    box = {}
    t = threading.Thread(target=lambda: box.update(p=OwnedProcess.launch(
        [sys.executable, "-c", sys.argv[2]], cwd="/", env=dict(os.environ), stdout=sys.stdout.fileno(), grace_s=30)))
    t.start(); t.join()  # launched from a thread that ends, as a Prefect task's
    print("keeper", box["p"].pid, flush=True)
    time.sleep(1000)
    """
)


def wait_until(cond, timeout_s: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def family_of(keeper: int) -> list[int]:
    return sorted(set(procs.group_members(keeper)) | set(procs.descendants(keeper)) | {keeper} - {0})


def alive(pids: list[int]) -> list[int]:
    return [p for p in pids if procs.identity(p) is not None and not procs.is_zombie(p)]


def test_sigkill_of_the_owner_ends_the_child_its_group_and_a_grandchild_that_left_the_group(tmp_path: Path) -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c", _OWNER, str(REPO), FAMILY], stdout=subprocess.PIPE, text=True, cwd=tmp_path
    )
    try:
        assert owner.stdout is not None
        lines = [owner.stdout.readline().strip(), owner.stdout.readline().strip()]
        keeper = int(next(line for line in lines if line.startswith("keeper")).split()[1])
        assert "up" in lines
        assert wait_until(lambda: len(alive(family_of(keeper))) == 4, 10), family_of(keeper)  # keeper, child, 2 sleeps
        time.sleep(1.0)  # the launching thread has long ended: the family lives on
        family = family_of(keeper)
        assert len(alive(family)) == 4
        owner.kill()
        owner.wait()
        t0 = time.monotonic()
        assert wait_until(lambda: not alive(family), 10), [procs.identity(p) for p in alive(family)]
        assert time.monotonic() - t0 < 10
    finally:
        owner.kill()
        owner.wait()


def test_stop_ends_the_group_and_a_child_exit_code_comes_back(tmp_path: Path) -> None:
    proc = OwnedProcess.launch([sys.executable, "-c", FAMILY], cwd=tmp_path, env=dict(os.environ), stdout=None)
    assert wait_until(lambda: len(alive(family_of(proc.pid))) == 4, 10)
    family = family_of(proc.pid)
    assert proc.poll() is None
    proc.stop()
    assert proc.returncode is not None and not alive(family)
    proc.stop()  # twice is fine

    quits = OwnedProcess.launch(
        [sys.executable, "-c", "import subprocess, sys; subprocess.Popen(['sleep', '1000']); sys.exit(3)"],
        cwd=tmp_path, env=dict(os.environ), stdout=None,
    )  # fmt: skip
    assert wait_until(lambda: quits.poll() is not None, 10)
    assert quits.returncode == 3  # the child's code, not the keeper's
    assert procs.group_members(quits.pgid) == []  # its straggler went with it
    quits.stop()


def test_sigkill_of_the_keeper_alone_takes_the_child_with_it(tmp_path: Path) -> None:
    proc = OwnedProcess.launch([sys.executable, "-c", FAMILY], cwd=tmp_path, env=dict(os.environ), stdout=None)
    assert wait_until(lambda: len(alive(family_of(proc.pid))) == 4, 10)
    family = family_of(proc.pid)
    children = [p for p in family if procs.parent(p) == proc.pid]
    os.kill(proc.pid, signal.SIGKILL)
    assert wait_until(lambda: not alive(children), 10)  # PR_SET_PDEATHSIG
    proc.stop()
    for p in alive(family):  # the child's own children have no death signal (SGLang's do)
        os.kill(p, signal.SIGKILL)


def started_sleep() -> subprocess.Popen[bytes]:
    """`sleep 1000` in a process group of its own, once it runs sleep (its command line before exec is ours)."""
    proc = subprocess.Popen(["sleep", "1000"], start_new_session=True)
    assert wait_until(lambda: procs.cmdline(proc.pid) == ("sleep", "1000"), 10)
    return proc


def _record(tmp_path: Path, keeper: procs.ProcIdentity, owner: procs.ProcIdentity) -> Path:
    path = tmp_path / "server" / "server.json"
    record = ServerRecord(
        host=socket.gethostname(), port=1, url="http://127.0.0.1:1", pgid=keeper.pid, keeper=keeper, owner=owner,
        started_at="2026-01-01T00:00:00Z", log=str(tmp_path / "server" / "sglang.log"),
    )  # fmt: skip
    write_record(path, record)
    return path


def dead_owner() -> procs.ProcIdentity:
    gone = subprocess.Popen(["true"])
    gone.wait()
    return procs.ProcIdentity(gone.pid, 1, ("python", "flow"))


def test_a_record_left_by_a_dead_owner_stops_its_server_group(tmp_path: Path) -> None:
    orphan = started_sleep()  # a server whose keeper survived its owner
    try:
        ident = procs.identity(orphan.pid)
        assert ident is not None
        path = _record(tmp_path, ident, dead_owner())
        reaped = reap_orphan(path, grace_s=5)
        assert reaped is not None and [p.pid for p in reaped.stopped] == [orphan.pid]
        assert orphan.wait(10) == -signal.SIGTERM
        assert not path.exists()
        assert "stopped an orphaned server" in reaped.describe() and str(orphan.pid) in reaped.describe()
    finally:
        orphan.kill()


def test_a_record_whose_pid_is_now_another_process_is_not_touched(tmp_path: Path) -> None:
    """The server was started by hand after the recorded one died and got its pid: the start time differs."""
    other = started_sleep()
    try:
        ident = procs.identity(other.pid)
        assert ident is not None
        recorded = procs.ProcIdentity(other.pid, ident.start_ticks - 1, ident.cmdline)  # same pid, earlier process
        path = _record(tmp_path, recorded, dead_owner())
        reaped = reap_orphan(path, grace_s=5)
        assert reaped is not None and reaped.stopped == []
        time.sleep(0.5)
        assert other.poll() is None  # not signalled
        assert "none of its processes runs any more" in reaped.describe()
    finally:
        other.kill()
        other.wait()


def test_a_record_whose_owner_lives_is_left_alone(tmp_path: Path) -> None:
    server = started_sleep()
    try:
        ident, me = procs.identity(server.pid), procs.identity(os.getpid())
        assert ident is not None and me is not None
        path = _record(tmp_path, ident, me)
        assert reap_orphan(path) is None
        assert server.poll() is None and read_record(path) is not None
    finally:
        server.kill()
        server.wait()


_LISTENER = "import socket, sys, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); " \
    "print(s.getsockname()[1], flush=True); time.sleep(1000)"  # fmt: skip


@pytest.mark.skipif(not SGLANG_PYTHON.exists(), reason="needs .venv-sglang (deploy/sglang_env.sh)")
def test_a_port_held_by_a_foreign_process_is_refused_naming_it_and_the_setting(tmp_path: Path) -> None:
    listener = subprocess.Popen([sys.executable, "-c", _LISTENER, "foreign-marker"], stdout=subprocess.PIPE, text=True)
    try:
        assert listener.stdout is not None
        port = int(listener.stdout.readline())
        holders = procs.port_holders(port)
        assert [pid for pid, _ in holders] == [listener.pid] and "foreign-marker" in holders[0][1]
        cfg = ServerConfig.model_validate(
            {"engine": "sglang", "device": "cpu", "python": str(SGLANG_PYTHON), "port": port}
        )
        server = SGLangServer(cfg, tmp_path, dump_dir=None, layers=None, log_dir=tmp_path / "log", base_env={})
        server.port_free_wait_s = 1.0  # (a port of a server killed a moment ago is waited for 15 s)
        with pytest.raises(ServerError) as e:
            server.start()
        msg = str(e.value)
        assert f"port {port}" in msg and f"pid {listener.pid}" in msg and "foreign-marker" in msg
        assert "server.port" in msg and "server.url" in msg
        assert not (tmp_path / "log" / "server.json").exists()  # nothing was launched
    finally:
        listener.kill()
        listener.wait()


def test_port_holders_is_empty_for_a_free_port() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening
        assert procs.port_holders(port) == []


def test_a_keeper_started_from_a_thread_outlives_that_thread(tmp_path: Path) -> None:
    box: dict[str, OwnedProcess] = {}
    t = threading.Thread(
        target=lambda: box.update(p=OwnedProcess.launch(["sleep", "1000"], cwd=tmp_path, env={}, stdout=None))
    )
    t.start()
    t.join()
    time.sleep(1.5)
    assert box["p"].poll() is None
    box["p"].stop()
    assert box["p"].returncode is not None
