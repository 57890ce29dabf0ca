"""What the pipeline and the plugin inside SGLang agree on is written once, in eagle3/store/dump_protocol.py: the SGLang
release and the names of the server's environment variables (deploy/sglang_env.sh reads the release there)."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

from eagle3.store import dump_protocol as proto

REPO = Path(__file__).resolve().parents[3]
ENV_NAME = re.compile(r"^EAGLE3_[A-Z_]*$")
VERSION = re.compile(r"^\d+\.\d+\.\d+")


def literals(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def test_the_plugin_environment_names_are_spelled_only_in_dump_protocol() -> None:
    spelled = {
        f"{p.relative_to(REPO)}: {s}"
        for package in ("eagle3", "server_patch", "tasks", "flows")
        for p in sorted((REPO / package).rglob("*.py"))
        if p != REPO / "eagle3" / "store" / "dump_protocol.py"
        for s in literals(p)
        if ENV_NAME.match(s)
    }
    assert spelled == set()
    assert proto.ENV_CPU_SPEC.startswith(proto.ENV_PREFIX) and proto.ENV_DUMP_DIR.startswith(proto.ENV_PREFIX)


def test_the_sglang_release_is_pinned_once_and_the_env_script_reads_it() -> None:
    pinned = {
        f"{p.relative_to(REPO)}: {s}"
        for package in ("eagle3", "server_patch")
        for p in sorted((REPO / package).rglob("*.py"))
        if p != REPO / "eagle3" / "store" / "dump_protocol.py"
        for s in literals(p)
        if s in proto.SUPPORTED_SGLANG
    }
    assert pinned == set()
    assert all(VERSION.match(v) for v in proto.SUPPORTED_SGLANG)
    script = (REPO / "deploy" / "sglang_env.sh").read_text()
    line = next(x for x in script.splitlines() if x.startswith("SGLANG_VERSION="))
    read = subprocess.run(["bash", "-c", f"{line}; echo $SGLANG_VERSION"], cwd=REPO, capture_output=True, text=True)
    assert read.stdout.strip() == proto.SUPPORTED_SGLANG[0]
    assert not (REPO / "deploy" / "sglang_requirements.txt").exists()
