"""tests/ports.py: two test processes asking for ports at once are never handed the same one, and none comes from
the kernel's ephemeral range (where outgoing connections take their source ports)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.ports import HIGH, LOW, bindable, free_port

REPO = Path(__file__).resolve().parents[3]
ASK = "from tests.ports import free_port\nprint(' '.join(str(free_port()) for _ in range(200)), flush=True)\ninput()\n"


def test_two_processes_asking_at_once_get_disjoint_ports_below_the_ephemeral_range() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-c", ASK], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True) for _ in range(2)]  # fmt: skip
    try:
        got = [set(map(int, p.stdout.readline().split())) for p in procs if p.stdout is not None]
        mine = {free_port() for _ in range(20)}  # while theirs are held
    finally:
        for p in procs:
            p.communicate("\n", timeout=30)  # the claims lapse as each exits
    assert [len(g) for g in got] == [200, 200] and not got[0] & got[1]  # each distinct, none shared
    assert len(mine) == 20 and not mine & (got[0] | got[1])
    assert all(LOW <= p < HIGH for p in got[0] | got[1] | mine)
    assert all(bindable(p) for p in mine)
