"""The shortest prefixes launch_args.py reads SGLang flags by, against the parser of the SGLang it pins: each one is
taken by argparse as its flag alone, and one character less would not be (so no shorter spelling is missed)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from eagle3.serving import launch_args
from tests.integration.sglang_support import SGLANG_PYTHON, require_sglang_env

DUMP = """
import argparse, json
from sglang.srt.server_args import ServerArgs
p = argparse.ArgumentParser()
ServerArgs.add_cli_args(p)
print(json.dumps({"allow_abbrev": p.allow_abbrev, "flags": [o for a in p._actions for o in a.option_strings]}))
"""

pytestmark = pytest.mark.sglang


def test_each_prefix_read_is_the_shortest_one_sglangs_parser_takes_for_its_flag() -> None:
    require_sglang_env()
    env = {**os.environ, "LD_LIBRARY_PATH": str(SGLANG_PYTHON.parent.parent / "stub")}  # the stub libcuda on a CPU
    out = subprocess.run([str(SGLANG_PYTHON), "-c", DUMP], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    parser = json.loads(out.stdout.strip().splitlines()[-1])
    assert parser["allow_abbrev"]  # else only the full flags count, and the prefixes need not be read
    flags = parser["flags"]
    for flag, shortest in launch_args._SHORTEST.items():
        assert [f for f in flags if f.startswith(shortest)] == [flag], (flag, shortest)
        assert len([f for f in flags if f.startswith(shortest[:-1])]) > 1, (flag, shortest)
