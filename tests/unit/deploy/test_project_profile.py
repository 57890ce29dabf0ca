"""deploy/project_profile.py: the project profile points at the local server, is active, and keeps other profiles."""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[3]


def project_profile() -> ModuleType:
    spec = importlib.util.spec_from_file_location("eagle3_project_profile", REPO / "deploy" / "project_profile.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_eagle3_profile_is_written_active_and_other_profiles_are_kept(tmp_path: Path) -> None:
    pp = project_profile()
    path = tmp_path / ".prefect" / "profiles.toml"
    path.parent.mkdir()
    path.write_text('active = "mine"\n[profiles.mine]\nPREFECT_API_URL = "http://elsewhere:4200/api"\n')
    pp.point_profile("http://127.0.0.1:4300/api", path)
    data = tomllib.loads(path.read_text())
    assert data["active"] == "eagle3"
    assert data["profiles"]["eagle3"] == {"PREFECT_API_URL": "http://127.0.0.1:4300/api"}
    assert data["profiles"]["mine"] == {"PREFECT_API_URL": "http://elsewhere:4200/api"}
    pp.point_profile("http://127.0.0.1:4200/api", path)  # a restart on another port repoints it
    assert tomllib.loads(path.read_text())["profiles"]["eagle3"]["PREFECT_API_URL"] == "http://127.0.0.1:4200/api"


def test_prefect_toml_keeps_prefect_in_the_project_and_off_the_throwaway_server() -> None:
    toml = tomllib.loads((REPO / "prefect.toml").read_text())
    assert toml["home"] == ".prefect" and toml["profiles_path"] == ".prefect/profiles.toml"
    assert toml["server"]["ephemeral"]["enabled"] is False
    assert "api" not in toml  # the URL comes from the profile the server start writes (any port)
