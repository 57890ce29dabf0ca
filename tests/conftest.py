"""Shared fixtures. The demo model is installed once into the repo's data/ dir and reused.

A test session leaves no process behind, whether it finishes or is stopped with SIGTERM (a CI timeout, an
operator, deploy/run_tests.sh forwarding one):
* SIGTERM is turned into KeyboardInterrupt (and stops the session), so fixtures are torn down: a Prefect server,
  an SGLang server, a worker started by a fixture stops. pytest's default SIGTERM would end it without teardown.
  (The SGLang servers and trainers go with this process in any case: eagle3/serving/keeper.py, eagle3/train/launch.py.)
* Every process the session starts inherits SESSION_ENV; at the very end (after the session fixtures' teardown)
  the project's processes that still carry this session's mark (Prefect servers and workers, SGLang servers and
  their keepers, torchrun, eagle3) are listed, killed, and fail the run.
* pytest killed with SIGKILL (no teardown, no end of session): tests/reaper.py, started at session start, sees its
  pipe from pytest close and ends every process that carries this session's mark.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import reaper

pytest_plugins = ["tests.timing"]  # time per directory and marker, and the budget (docs/testing.md)

REPO = Path(__file__).resolve().parents[1]
DATA_DIR = REPO / "data"
SESSION_ENV = reaper.SESSION_ENV  # not EAGLE3_*: the SGLang launch drops those from the server's environment
PROJECT_SIGNS = ("prefect", "sglang", "eagle3", "torch.distributed", "torchrun", "eagle3.train.worker", "uvicorn")
# Servers stopped by the last teardown (SIGTERM, grace) may take a few seconds to go.
LEFTOVER_WAIT_S = float(os.environ.get("PYTEST_LEFTOVER_WAIT_S", "20"))
EPHEMERAL_PREFECT = "prefect.server.api.server:create_app"
_SESSION: dict[str, Any] = {}


@pytest.fixture(scope="session")
def demo_model() -> Path:
    from eagle3.target.demo import ensure_demo_model

    return ensure_demo_model(DATA_DIR)


@pytest.fixture(scope="session")
def demo_tokenizer(demo_model: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(demo_model)


@pytest.fixture(scope="session")
def tiny_models(demo_model: Path) -> dict[str, Path]:
    """Every tiny random-weight target (eagle3/target/tiny.py; its recipes are rows of eagle3/target/families.py,
    including those SGLang serves block drafters only or refuses), built once under data/models/ and reused."""
    from eagle3.target.families import TINY_ARCHITECTURES
    from eagle3.target.tiny import ensure_tiny_model

    return {arch: ensure_tiny_model(DATA_DIR, arch) for arch in TINY_ARCHITECTURES}


# In CI the SGLang and browser tiers must run: a skip there (environment missing) is a failure.
_MUST_RUN_IN_CI = ("sglang", "ui")


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Two shared cores: intra-op threads fighting loader threads (or each other) make CPU model tests 10x slower."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if report.skipped and os.environ.get("CI") and any(item.get_closest_marker(m) for m in _MUST_RUN_IN_CI):
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, where the {_MUST_RUN_IN_CI} tiers must run: {report.longrepr}"


# no process left behind ----------------------------------------------------------------------------------------------
def _on_sigterm(signum: int, frame: object) -> None:
    session = _SESSION.get("session")
    if session is not None:
        session.shouldstop = "SIGTERM received: stopping (fixtures are torn down)"
    raise KeyboardInterrupt(f"signal {signum} (SIGTERM): stopping the test run")


def pytest_sessionstart(session: pytest.Session) -> None:
    token = f"{os.getpid()}-{secrets.token_hex(4)}"
    _SESSION.update(session=session, token=token)
    # Appended: a pytest run started by a test (tests/integration/test_no_leftovers.py) marks its processes for both.
    os.environ[SESSION_ENV] = " ".join(filter(None, [os.environ.get(SESSION_ENV, ""), token]))
    signal.signal(signal.SIGTERM, _on_sigterm)
    _SESSION["reaper"] = start_reaper(token)


def start_reaper(token: str) -> tuple[subprocess.Popen[bytes], int]:
    """tests/reaper.py for this session, and the pipe's write end (closed by this process's death)."""
    from eagle3.serving import procs

    ticks = procs.start_ticks(os.getpid())
    r, w = os.pipe()  # close-on-exec: no other child of this process gets `w`
    env = {k: v for k, v in os.environ.items() if k != SESSION_ENV}  # unmarked: it never lists itself
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", reaper.__file__, str(REPO), str(os.getpid()), str(ticks), token, str(r)],
            pass_fds=(r,), env=env, stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
    finally:
        os.close(r)
    return proc, w


def session_processes(token: str) -> list[tuple[int, str]]:
    """(pid, command line) of live project processes whose environment carries `token` (not this one)."""
    from eagle3.serving import procs

    out = []
    for pid in reaper.marked(token):
        line = " ".join(procs.cmdline(pid))
        if EPHEMERAL_PREFECT in line and procs.parent(pid) == os.getpid():
            continue  # Prefect's own temporary server of this process: Prefect stops it at exit (atexit)
        if any(sign in line for sign in PROJECT_SIGNS):
            out.append((pid, line))
    return out


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """After every fixture's teardown: list, kill and fail on project processes this session left running."""
    token = _SESSION.get("token")
    if token is None:
        return
    if (started := _SESSION.pop("reaper", None)) is not None:  # torn down: the reaper has nothing to do
        proc, w = started
        with contextlib.suppress(OSError):
            os.write(w, reaper.DONE)
        os.close(w)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
    deadline = time.monotonic() + LEFTOVER_WAIT_S
    left = session_processes(token)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = session_processes(token)
    if not left:
        return
    for pid, _ in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    lines = "\n".join(f"  pid {pid}: {line[:300]}" for pid, line in left)
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    message = f"LEFTOVER PROCESSES: this test run left {len(left)} project process(es) running (now killed):\n{lines}"
    if tr is not None:
        tr.write_line(message, red=True)
    else:
        print(message)
    if session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
