"""Where a device setting lands: the one place `auto` is resolved, for every setting that names a device
(`server.device`, `train.device`, `evaluate.device`).

    resolve_device("auto")                          "cuda" when torch sees a GPU, else "cpu"; other settings as given
    resolve_device("auto", cuda=nvidia_smi_present) the same, asked of the node (an SGLang server runs in another
                                                    interpreter: this process's torch does not speak for it)
    torch_device("auto", index=local_rank)          the torch.device of a setting (cuda:index on a GPU)
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from typing import TYPE_CHECKING

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
