"""One plain SGLang server of the demo model for the session (bf16, no hidden-state hook), started on first use and
shared by tests that only send it requests: the prompts stage with multi-sample synthesize, the live measurement.
An SGLang start costs about a minute of both cores here; tests that kill, hang or reconfigure a server, or compare
greedy outputs across runs (bf16 numerics depend on batching), start their own."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import eagle3.data.synthesize as synth
from eagle3.serving.server import SGLangServer
from tests.integration.sglang_support import SYNTH_PROMPTS, require_sglang_env, synthesize_config


@pytest.fixture(scope="session")
def plain_server(tmp_path_factory: pytest.TempPathFactory, demo_model: Path) -> Iterator[SGLangServer]:
    require_sglang_env()
    root = tmp_path_factory.mktemp("plain-server")
    cfg = synthesize_config(root / "run", demo_model, SYNTH_PROMPTS)
    (server,) = synth.open_servers(cfg, demo_model, dict(os.environ), root / "server")
    server.start()
    try:
        yield server
    finally:
        server.stop()
