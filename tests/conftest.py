"""Shared fixtures. The demo model is installed once into the repo's data/ dir and reused."""

from __future__ import annotations

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
