"""The one way a target model is loaded in this process: the transformers engine, the prompts stage, synthesize
and the offline evaluator all call load_causal_lm."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def load_causal_lm(model_dir: Path, dtype: torch.dtype, device: torch.device | str | None) -> Any:
    """AutoModelForCausalLM in eval mode, on `device`; None: spread by accelerate over the visible GPUs
    (device_map="auto", for a model one GPU does not hold). No process-wide cache: the caller holds the weights as
    long as it needs them (eagle3.extract.engines.transformers_engine.LoadedModels)."""
    from transformers import AutoModelForCausalLM

    if device is None:
        model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, device_map="auto")
        return model.eval()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    return model.to(device).eval()
