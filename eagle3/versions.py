"""Library versions recorded in run.json, read from package metadata (never by importing Prefect)."""

from __future__ import annotations

import importlib.metadata
import platform

import eagle3

DISTRIBUTIONS = ("torch", "transformers", "safetensors", "datasets", "pydantic", "prefect")
THIS_DISTRIBUTION = "eagle3-pipeline"


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def library_versions() -> dict[str, str]:
    """{name: version} for the libraries that shape the stored data; absent packages are left out."""
    out = {name: v for name in DISTRIBUTIONS if (v := _version(name)) is not None}
    out["python"] = platform.python_version()
    out[THIS_DISTRIBUTION] = _version(THIS_DISTRIBUTION) or eagle3.__version__
    cuda = _cuda_version()
    if cuda:
        out["cuda"] = cuda
    return out


def _cuda_version() -> str | None:
    """CUDA that torch was built with (None for CPU builds or when torch is missing)."""
    try:
        import torch
    except ImportError:
        return None
    return torch.version.cuda
