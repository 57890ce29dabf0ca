"""The cost tables every run prints (tests/timing.py): a test file's CPU seconds include the processes it started and
reaped, and a file that only waits shows next to none."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6:\n    pass\n"


def test_cpu_per_file_counts_the_children_a_test_reaped_and_not_a_wait(tmp_path: Path) -> None:
    (tmp_path / "test_burns.py").write_text(
        f"import subprocess, sys\ndef test_child():\n    subprocess.run([sys.executable, '-c', {BURN!r}], check=True)\n"
    )
    (tmp_path / "test_waits.py").write_text("import time\ndef test_wait():\n    time.sleep(0.6)\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "pytest", "-p", "tests.timing", "-p", "no:cacheprovider", "-q", str(tmp_path)]
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "CPU seconds per file" in out.stdout, out.stdout
    cpu = {m[2]: float(m[1]) for m in re.finditer(r"^\s*([0-9.]+)  (\S*test_\w+\.py)$", out.stdout, re.M)}
    burns = next(v for k, v in cpu.items() if k.endswith("test_burns.py"))
    waits = next(v for k, v in cpu.items() if k.endswith("test_waits.py"))
    assert burns >= 0.6 and waits < 0.3, cpu
