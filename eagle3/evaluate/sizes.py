"""The evaluation's size on this worker: num_prompts and max_new_tokens as the config gives them, else by the device
the offline evaluation resolves to (eagle3.config.evaluate.EVAL_SIZES: 20 x 64 on a GPU, 8 x 32 on a CPU)."""

from __future__ import annotations

from eagle3.config import EvaluateConfig
from eagle3.device import resolve_device


def sized_here(cfg: EvaluateConfig) -> EvaluateConfig:
    """cfg with num_prompts and max_new_tokens set (idempotent)."""
    return cfg.sized(resolve_device(cfg.device))


def new_tokens(cfg: EvaluateConfig) -> int:
    """Tokens generated per prompt on this worker."""
    tokens = sized_here(cfg).max_new_tokens
    assert tokens is not None  # sized() sets it
    return tokens
