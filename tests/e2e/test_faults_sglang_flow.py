"""The Prefect extract flow with `server.engine: sglang` (real SGLang on CPU, a real local Prefect server),
when the SGLang server is SIGKILLed mid-shard: the engine restarts it inside the shard task, the flow ends
Completed, and the shard holds every sample exactly once (tests/integration/test_faults_sglang.py has the
check and the timeout fault)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from eagle3.store.run_store import RunStore
from tests.integration.sglang_support import TEXTS, prepared, require_sglang_env, sglang_config, write_prepared
from tests.integration.test_faults_sglang import assert_exactly_once, wait_for

pytestmark = [pytest.mark.sglang, pytest.mark.slow]
PORT = 31102
LAUNCH = "==== eagle3: launching SGLang"  # eagle3/serving/server.py writes it to the server log before each launch


def server_leaders(port: int) -> list[int]:
    """Pids of `sglang.launch_server` processes listening on `port` (each in the process group of its keeper)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                argv = (d / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"sglang.launch_server" in argv[:3] and b"--port" in argv and str(port).encode() in argv:  # not keepers
                out.append(int(d.name))
    return out


def test_a_server_sigkilled_mid_shard_is_restarted_by_the_flow_and_the_shard_holds_each_sample_once(
    prefect_server: str, tmp_path: Path, demo_model: Path, demo_tokenizer: Any
) -> None:
    from flows.extract import extract_flow

    require_sglang_env()
    cfg = sglang_config(tmp_path / "run", demo_model, port=PORT, max_restarts=1)
    cfg.extract.shard_retries = 0  # the engine's restart must save the shard, not a Prefect retry of the task
    cfg.extract.request_timeout_s = 120
    samples = prepared(demo_tokenizer, [*TEXTS, TEXTS[2].upper(), TEXTS[2].lower()])  # 8 samples, one shard
    store = RunStore(cfg.run_dir)
    write_prepared(store, demo_model, samples)
    killed: dict[str, Any] = {}

    def files() -> int:
        return len(list(store.shard_dir(0).glob("*.safetensors")))

    def kill_the_server_mid_shard() -> None:
        try:
            wait_for("two samples in the store", lambda: files() >= 2, 900)
            (leader,) = server_leaders(PORT)
            os.killpg(os.getpgid(leader), signal.SIGKILL)  # the whole server (and its keeper) at once
            killed["samples_at_kill"] = files()
        except BaseException as e:
            killed["error"] = e

    watcher = threading.Thread(target=kill_the_server_mid_shard, daemon=True)
    watcher.start()
    state = extract_flow(cfg, return_state=True)
    watcher.join(60)
    assert "error" not in killed, killed
    assert state.is_completed(), state.message
    assert 2 <= killed["samples_at_kill"] < len(samples)

    log = (Path(cfg.run_dir) / "server" / "sglang.log").read_text(errors="replace")
    assert log.count(LAUNCH) == 2  # launched, killed, launched again by the engine (server.max_restarts)
    deadline = time.monotonic() + 30
    while server_leaders(PORT) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert server_leaders(PORT) == []  # the flow stopped the restarted server
    assert_exactly_once(store, samples, Path(cfg.run_dir) / "dump")
