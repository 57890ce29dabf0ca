"""A free TCP port on 127.0.0.1, for the servers and torchrun rendezvous the tests start.

Not the kernel's pick (bind to port 0): that comes from the ephemeral range, where the other pytest process
(deploy/run_tests.sh runs two) gets its ports the same way and every outgoing connection takes its source port, so a
port free when picked could be taken before the server bound it a minute later (a fresh-clone run, session 16: an
SGLang server of tests/e2e/test_server_owner_flow.py never listened). Ports come from below the ephemeral range
instead, and each is claimed by a lock on a file in a directory all test processes share, held until this process
exits: no two test processes are handed the same port, and a dead one's claims lapse with it.
"""

from __future__ import annotations

import fcntl
import os
import random
import socket
import tempfile
from pathlib import Path

#: Below Linux's default ip_local_port_range (32768-60999) and clear of server.port's default (30000, which a
#: test's config may leave as it is): SGLang also takes a port 100-1000 above its own.
LOW, HIGH = 20000, 29000
CLAIMS = Path(tempfile.gettempdir()) / "eagle3-test-ports"
_claimed: list[int] = []  # open, locked claim files: the claims last as long as this process
_pick = random.SystemRandom()  # not the `random` module's state, which tests seed


def bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    CLAIMS.mkdir(exist_ok=True)
    for _ in range(1000):
        port = _pick.randrange(LOW, HIGH)
        fd = os.open(CLAIMS / str(port), os.O_CREAT | os.O_RDWR, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a lock this process holds fails too: never handed twice
        except BlockingIOError:
            os.close(fd)
            continue
        if bindable(port):
            _claimed.append(fd)
            return port
        os.close(fd)
    raise RuntimeError(f"no free port in {LOW}-{HIGH} after 1000 tries (claims in {CLAIMS})")
