"""pyproject.toml gives the license as an SPDX expression (a TOML table makes setuptools warn on every install)."""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_the_license_is_an_spdx_string_and_setuptools_is_new_enough_to_read_it() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert pyproject["project"]["license"] == "Apache-2.0"
    assert "setuptools>=77" in pyproject["build-system"]["requires"]  # PEP 639 support
