"""Built once per session, on first use:

plain_server  one plain SGLang server of the demo model (bf16, no hidden-state hook), shared by tests that only
              send it requests: the prompts stage with multi-sample synthesize, the live measurement. An SGLang
              start costs about a minute of both cores here; tests that kill, hang or reconfigure a server, or
              compare greedy outputs across runs (bf16 numerics depend on batching), start their own.
demo_store    a converted float32 demo store the target wrote itself (synthesize, extract, convert: ~10 s), shared by
              the retraining tests and the golden curve (test_retrain.py, test_golden_curve.py); they train into
              directories of their own and leave its samples as they are.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from eagle3.config import PipelineConfig
from eagle3.serving.server import SGLangServer
from tests.integration.demo_facts import build_demo_store
from tests.integration.sglang_support import plain_server_at


@pytest.fixture(scope="session")
def plain_server(tmp_path_factory: pytest.TempPathFactory, demo_model: Path) -> Iterator[SGLangServer]:
    with plain_server_at(tmp_path_factory.mktemp("plain-server"), demo_model) as server:
        yield server


@pytest.fixture(scope="session")
def demo_store(tmp_path_factory: pytest.TempPathFactory, demo_model: Path) -> PipelineConfig:
    """A converted demo store of twelve short conversations whose answers the target wrote itself (synthesize,
    greedy), so a trained draft can learn what the target says; the evaluation set is its first three prompts."""
    return build_demo_store(tmp_path_factory.mktemp("demo-store"), demo_model)
