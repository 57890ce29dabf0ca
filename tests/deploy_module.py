"""deploy/deployments.py loaded as a module: it is a script beside deploy/prefect.yaml, not part of a package."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def deployments_module() -> Any:
    spec = importlib.util.spec_from_file_location("eagle3_deployments", REPO / "deploy" / "deployments.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses and pydantic models look themselves up by module name
    spec.loader.exec_module(module)
    return module
