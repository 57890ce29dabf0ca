"""eagle3/device.py: the one place a device setting's `auto` is resolved."""

from __future__ import annotations

import torch

from eagle3.device import resolve_device, torch_device


def test_auto_follows_the_probe_and_explicit_settings_are_kept() -> None:
    assert resolve_device("auto", cuda=lambda: True) == "cuda"
    assert resolve_device("auto", cuda=lambda: False) == "cpu"
    assert resolve_device("cpu", cuda=lambda: True) == "cpu"
    assert resolve_device("cuda:3", cuda=lambda: False) == "cuda:3"


def test_torch_device_puts_a_rank_on_its_gpu_and_leaves_cpu_alone() -> None:
    assert torch_device("cuda", index=2) == torch.device("cuda", 2)
    assert torch_device("cuda:1", index=2) == torch.device("cuda", 1)
    assert torch_device("cpu", index=2) == torch.device("cpu")
    assert torch_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
