"""Real SGLang on CPU, launched the wrong way on purpose (radix cache on), then killed: cached prefixes
fail with a clear message instead of silently missing rows, and a crashed server is restarted."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eagle3.extract.engines.base import Dumped, Failed
from eagle3.extract.engines.sglang_engine import SGLangEngine
from eagle3.serving.server import SGLangServer
from eagle3.store import dump_protocol as proto
from tests.integration.sglang_support import TEXTS, prepared, require_sglang_env, sglang_config, start_server

pytestmark = [pytest.mark.sglang, pytest.mark.slow]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, demo_model: Path) -> Iterator[dict[str, Any]]:
    require_sglang_env()
    root = tmp_path_factory.mktemp("sglang-radix")
    cfg = sglang_config(root / "run", demo_model, max_restarts=1)
    dump_dir = root / "dump"
    server = start_server(cfg, demo_model, dump_dir, radix_cache=True)
    try:
        yield {"cfg": cfg, "server": server, "dump_dir": dump_dir}
    finally:
        server.stop()


def engine(env: dict[str, Any], run_id: str) -> SGLangEngine:
    cfg = env["cfg"]
    return SGLangEngine(cfg, Path(cfg.model), run_id, env["dump_dir"], server=env["server"])


def test_a_cached_prefix_fails_the_sample_with_a_clear_message(env: dict[str, Any], demo_tokenizer: Any) -> None:
    sample = prepared(demo_tokenizer, [TEXTS[1]])[0]
    (first,) = engine(env, "radix-a").extract([sample])
    assert isinstance(first, Dumped)  # nothing cached yet: every row was computed
    first.path.unlink()
    (again,) = engine(env, "radix-b").extract([sample])  # same tokens, new rid: the prefix is cached now
    assert isinstance(again, Failed)
    assert "prefix cache" in again.reason and "--disable-radix-cache" in again.reason
    assert "not 0" in again.reason  # the hook's own report on the rows it saw
    assert [p.name for p in env["dump_dir"].iterdir() if p.name != proto.STATUS_DIR] == []


def test_a_crashed_server_is_restarted_and_the_sample_retried(env: dict[str, Any], demo_tokenizer: Any) -> None:
    server: SGLangServer = env["server"]
    before, after = prepared(demo_tokenizer, ["Sent before the crash.", "Sent after the crash."])
    e = engine(env, "crash")
    (out,) = e.extract([before])
    assert isinstance(out, Dumped)
    assert server._proc is not None
    os.killpg(server._proc.pid, signal.SIGKILL)  # a crash: no clean shutdown
    server._proc.wait(30)
    (out2,) = e.extract([after])
    assert isinstance(out2, Dumped), getattr(out2, "reason", out2)
    assert server.restarts == 1 and server.is_alive()
    for o in (out, out2):
        o.path.unlink()
