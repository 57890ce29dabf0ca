"""Shared fixtures. The demo model is installed once into the repo's data/ dir and reused."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA_DIR = REPO / "data"


@pytest.fixture(scope="session")
def demo_model() -> Path:
    from eagle3.model_files import ensure_demo_model

    return ensure_demo_model(DATA_DIR)


@pytest.fixture(scope="session")
def demo_tokenizer(demo_model: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(demo_model)


# In CI the SGLang and browser tiers must run: a skip there (environment missing) is a failure.
_MUST_RUN_IN_CI = ("sglang", "ui")


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Two shared cores: intra-op threads fighting loader threads (or each other) make CPU model tests 10x slower."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if report.skipped and os.environ.get("CI") and any(item.get_closest_marker(m) for m in _MUST_RUN_IN_CI):
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, where the {_MUST_RUN_IN_CI} tiers must run: {report.longrepr}"
