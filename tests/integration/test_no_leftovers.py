"""A test run leaves no process behind (tests/conftest.py): a pytest run that leaves a project process fails and
names it; a pytest run stopped with SIGTERM in the middle of an SGLang test (real SGLang on CPU) tears its
fixtures down and nothing of its server survives; a pytest run killed with SIGKILL while its fixture's Prefect
server runs (started detached, as `make demo` starts one) leaves nothing either (tests/reaper.py). Each runs pytest
in a subprocess on a test file of its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from eagle3.serving import procs
from tests.conftest import session_processes
from tests.integration.sglang_support import require_sglang_env

REPO = Path(__file__).resolve().parents[2]


def start_pytest(
    tmp_path: Path, test_source: str, plugins: tuple[str, ...] = ("tests.conftest",), **env: str
) -> subprocess.Popen[str]:
    """pytest on one test file under tmp_path, with this project's conftest as a plugin (fixtures, the checks)."""
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(test_source))
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, **env}
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", *(a for p in plugins for a in ("-p", p)), "-c", os.devnull,
         "--rootdir", str(tmp_path), "-p", "no:cacheprovider", "-q", "-s", str(tmp_path / "test_inner.py")],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def wait_for_line(run: subprocess.Popen[str], start: str, timeout_s: float) -> tuple[str, list[str]]:
    """The first line of `run`'s output that starts with `start`, and every line read so far."""
    assert run.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout_s
    while not any(line.startswith(start) for line in lines):
        line = run.stdout.readline()
        assert line or run.poll() is None, "".join(lines)
        assert time.monotonic() < deadline, "".join(lines)
        lines.append(line)
    return next(line for line in lines if line.startswith(start)), lines


def test_a_run_that_leaves_a_project_process_fails_naming_it_and_kills_it(tmp_path: Path) -> None:
    run = start_pytest(
        tmp_path,
        """
        import subprocess, sys
        def test_forgets_a_child():
            p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", "eagle3-leftover-sign"])
            print("CHILD", p.pid, flush=True)
        """,
        PYTEST_LEFTOVER_WAIT_S="2",
    )
    out, _ = run.communicate(timeout=120)
    child = int(next(line for line in out.splitlines() if line.startswith("CHILD")).split()[1])
    assert run.returncode == 1, out  # the test passed; the leftover fails the run
    assert "LEFTOVER PROCESSES" in out and f"pid {child}:" in out and "eagle3-leftover-sign" in out
    assert procs.identity(child) is None or procs.is_zombie(child)  # and it was killed


@pytest.mark.sglang
@pytest.mark.slow
def test_sigterm_to_pytest_mid_sglang_test_tears_down_and_leaves_no_process(tmp_path: Path) -> None:
    require_sglang_env()
    run = start_pytest(
        tmp_path,
        """
        import os, time, pytest
        from tests.conftest import SESSION_ENV
        from tests.integration.sglang_support import sglang_config, start_server

        @pytest.fixture
        def server(tmp_path, demo_model):
            s = start_server(sglang_config(tmp_path / "run", demo_model), demo_model, tmp_path / "dump")
            yield s
            print("TEARDOWN", flush=True)
            s.stop()

        def test_holds_a_server(server):
            print("READY", server.pgid, server.port, os.environ[SESSION_ENV].split()[-1], flush=True)
            time.sleep(600)
        """,
    )
    ready, lines = wait_for_line(run, "READY", 900)
    _, pgid, port, token = ready.split()
    server = procs.group_members(int(pgid))
    assert len(server) >= 3, server  # keeper, SGLang, its scheduler and detokenizer
    run.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    rest, _ = run.communicate(timeout=120)
    out = "".join(lines) + rest
    assert run.returncode == pytest.ExitCode.INTERRUPTED, out
    assert "TEARDOWN" in out and "SIGTERM" in out, out  # the fixture's teardown ran
    assert "LEFTOVER" not in out, out
    assert time.monotonic() - t0 < 60
    assert [p for p in server if procs.identity(p) is not None and not procs.is_zombie(p)] == []
    assert procs.port_holders(int(port)) == []
    assert session_processes(token) == []


@pytest.mark.slow
def test_sigkill_to_pytest_while_its_prefect_server_runs_leaves_no_process(tmp_path: Path) -> None:
    """The e2e fixture's Prefect server is started detached (deploy/prefect_server.sh: `setsid`, what `make demo`
    needs); with pytest SIGKILLed, no teardown runs, and only tests/reaper.py can end it."""
    run = start_pytest(
        tmp_path,
        """
        import os, time
        from pathlib import Path
        from tests.conftest import SESSION_ENV

        def test_holds_a_prefect_server(prefect_server):
            pid = (Path(os.environ["PREFECT_HOME"]) / "server.pid").read_text().strip()
            print("READY", pid, prefect_server.rsplit(":", 1)[1].split("/")[0], os.environ[SESSION_ENV].split()[-1],
                  flush=True)
            time.sleep(600)
        """,
        plugins=("tests.conftest", "tests.e2e.conftest"),
    )
    ready, lines = wait_for_line(run, "READY", 300)
    _, pid, port, token = ready.split()
    server = procs.identity(int(pid))
    assert server is not None and session_processes(token), "".join(lines)  # the server, marked by the session
    run.kill()
    run.wait(30)
    deadline = time.monotonic() + 60
    while (session_processes(token) or procs.is_same(server)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not procs.is_same(server)
    assert session_processes(token) == [] and procs.port_holders(int(port)) == []
