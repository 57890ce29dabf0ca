"""Ends a test session's processes when pytest dies without its teardown (SIGKILL, the OOM killer, a CI runner
that kills the job): what tests/conftest.py's own end-of-session check cannot do, since it runs inside pytest.

    python -I tests/reaper.py <repo> <owner pid> <owner start ticks> <token> <pipe fd>

Started by tests/conftest.py at session start, in a session of its own (a `kill -- -PGID` of pytest's group
leaves it) and without the session's mark in its environment (it never lists itself). It blocks on the read end
of a pipe whose write end only pytest holds:
* pytest writes DONE and closes it at the end of a session that tore its fixtures down: the reaper exits;
* the pipe reaches EOF without DONE, or pytest's pid no longer runs pytest (a forked copy may hold the pipe):
  every live process whose environment carries this session's token gets SIGTERM, GRACE_S, then SIGKILL.

The processes that need it are the ones a fixture starts detached on purpose: a Prefect server and worker from
deploy/prefect_server.sh or deploy/serve.sh (`setsid`, so that `make demo`'s outlives its shell), and the flow
runs a worker starts. SGLang servers and trainers already end with their owner (eagle3/serving/keeper.py).
Standard library and eagle3.serving.procs only (an isolated interpreter, `-I`).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import time

DONE = b"done"
SESSION_ENV = "PYTEST_PROJECT_SESSIONS"  # tests/conftest.py's name (imported there from here)
GRACE_S = 10.0  # SIGTERM to SIGKILL: a Prefect server shuts down in ~2 s
POLL_S = 1.0


def marked(token: str) -> list[int]:
    """Live processes whose SESSION_ENV names `token`, this one and zombies excluded."""
    from eagle3.serving import procs

    key = f"{SESSION_ENV}=".encode()
    out = []
    for pid in procs.pids():
        if pid == os.getpid() or procs.is_zombie(pid):
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                values = f.read().split(b"\0")
        except OSError:
            continue
        mark = next((v for v in values if v.startswith(key)), None)
        if mark is not None and token.encode() in mark[len(key) :].split():
            out.append(pid)
    return out


def reap(token: str) -> int:
    """SIGTERM every marked process, GRACE_S, SIGKILL the rest (rescanning: a worker may start one meanwhile)."""
    ended: set[int] = set()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        deadline = time.monotonic() + (GRACE_S if sig == signal.SIGTERM else 5.0)
        while (left := marked(token)) and time.monotonic() < deadline:
            for pid in left:
                if pid not in ended or sig == signal.SIGKILL:
                    with contextlib.suppress(OSError):
                        os.kill(pid, sig)
                ended.add(pid)
            time.sleep(0.2)
        if not left:
            break
    return len(ended)


def main(argv: list[str]) -> int:
    repo, owner_pid, owner_ticks, token, fd = argv[0], int(argv[1]), int(argv[2]), argv[3], int(argv[4])
    sys.path.insert(0, repo)
    from eagle3.serving import procs

    got = b""
    while True:
        ready, _, _ = select.select([fd], [], [], POLL_S)
        if ready:
            chunk = os.read(fd, 64)
            if not chunk:
                break  # EOF
            got += chunk
            if got.startswith(DONE):
                return 0
        elif procs.start_ticks(owner_pid) != owner_ticks:
            break  # pytest is gone, and a forked copy of it holds the pipe
    n = reap(token)
    with contextlib.suppress(OSError):  # pytest's stdout may be a pipe nobody reads any more
        print(f"tests/reaper.py: pytest (pid {owner_pid}) died without its teardown; ended {n} process(es)", flush=True)
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C goes to pytest, which tears down itself
    sys.exit(main(sys.argv[1:]))
