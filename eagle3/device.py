"""Where a device setting lands: the one place `auto` is resolved, for every setting that names a device
(`server.device`, `train.device`, `evaluate.device`).

    resolve_device("auto")                          "cuda" when torch sees a GPU, else "cpu"; other settings as given
    resolve_device("auto", cuda=nvidia_smi_present) the same, asked of the node (an SGLang server runs in another
                                                    interpreter: this process's torch does not speak for it)
    torch_device("auto", index=local_rank)          the torch.device of a setting (cuda:index on a GPU)
    load_causal_lm(model_dir, dtype, device)        the one way a target model is loaded in this process (the
                                                    transformers engine, the prompts stage, synthesize, the
                                                    offline evaluator)
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def torch_cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def nvidia_smi_present(which: Callable[[str], str | None] = shutil.which) -> bool:
    return which("nvidia-smi") is not None


def resolve_device(setting: str, *, cuda: Callable[[], bool] = torch_cuda_available) -> str:
    """A device setting resolved: `auto` -> "cuda" when `cuda()` says one is there, else "cpu"; "cpu", "cuda" and
    "cuda:N" as given."""
    if setting != "auto":
        return setting
    return "cuda" if cuda() else "cpu"


def torch_device(setting: str, *, index: int | None = None) -> torch.device:
    """The torch.device of a setting; `index` picks the GPU where it resolves to plain "cuda" (a process's local
    rank)."""
    import torch

    name = resolve_device(setting)
    if name == "cuda" and index is not None:
        return torch.device("cuda", index)
    return torch.device(name)


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
