"""One plain SGLang server of the demo model for the session (bf16, no hidden-state hook), started on first use and
shared by tests that only send it requests: the prompts stage with multi-sample synthesize, the live measurement.
An SGLang start costs about a minute of both cores here; tests that kill, hang or reconfigure a server, or compare
greedy outputs across runs (bf16 numerics depend on batching), start their own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from eagle3.serving.server import SGLangServer
from tests.integration.sglang_support import plain_server_at


@pytest.fixture(scope="session")
def plain_server(tmp_path_factory: pytest.TempPathFactory, demo_model: Path) -> Iterator[SGLangServer]:
    with plain_server_at(tmp_path_factory.mktemp("plain-server"), demo_model) as server:
        yield server
