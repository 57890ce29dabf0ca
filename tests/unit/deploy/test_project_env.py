"""Prefect commands from a subdirectory of the project reach the project's settings (deploy/project_env.py), in a
fresh shell: no PREFECT_* exported, HOME elsewhere. The .pth line that runs it replaces an older install's and never
breaks the interpreter once the checkout is gone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.project_env import PTH_NAME, ROOT, install, pth_line, settings_env

PYTHON = Path(sys.executable)


def fresh_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    return env | {"HOME": str(home)}


def test_prefect_toml_settings_become_prefects_environment_variables_with_paths_from_the_root() -> None:
    env = settings_env({"home": ".prefect", "server": {"ephemeral": {"enabled": False}}, "flows": {"x": 30}})
    assert env == {"PREFECT_HOME": str(ROOT / ".prefect"), "PREFECT_SERVER_EPHEMERAL_ENABLED": "false",
                   "PREFECT_FLOWS_X": "30"}  # fmt: skip


@pytest.fixture
def installed() -> None:
    site = Path(__import__("sysconfig").get_paths()["purelib"])
    if not (site / PTH_NAME).is_file():
        pytest.fail(f"{site / PTH_NAME} is missing: `make venv` installs it (python deploy/project_env.py install)")


def test_prefect_from_a_subdirectory_uses_the_projects_home_and_no_throwaway_server(
    installed: None, tmp_path: Path
) -> None:
    prefect = PYTHON.parent / "prefect"
    out = subprocess.run([str(prefect), "config", "view"], cwd=ROOT / "docs", env=fresh_env(tmp_path),
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"PREFECT_HOME='{ROOT / '.prefect'}'" in out.stdout
    assert f"PREFECT_PROFILES_PATH='{ROOT / '.prefect' / 'profiles.toml'}'" in out.stdout
    assert "PREFECT_SERVER_EPHEMERAL_ENABLED='false'" in out.stdout
    assert not (tmp_path / ".prefect").exists()  # nothing written under the user's home


@pytest.mark.parametrize("where", ["outside", "exported"])
def test_outside_the_project_or_with_prefect_home_exported_nothing_is_changed(
    installed: None, tmp_path: Path, where: str
) -> None:
    env = fresh_env(tmp_path)
    cwd = tmp_path if where == "outside" else ROOT / "docs"
    if where == "exported":
        env["PREFECT_HOME"] = str(tmp_path / "mine")
    code = "import os; print(os.environ.get('PREFECT_HOME'))"
    out = subprocess.run([str(PYTHON), "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == ("None" if where == "outside" else str(tmp_path / "mine"))


def start_with_pth(line: str, site: Path, cwd: Path, home: Path) -> subprocess.CompletedProcess[str]:
    """A fresh interpreter that processes one .pth file holding `line` (no other site-packages .pth)."""
    (site / PTH_NAME).write_text(line)
    code = f"import site; site.addsitedir({str(site)!r}); import os; print(os.environ.get('PREFECT_HOME'))"
    return subprocess.run([str(PYTHON), "-S", "-c", code], cwd=cwd, env=fresh_env(home), capture_output=True,
                          text=True, timeout=60)  # fmt: skip


def test_the_pth_line_runs_this_checkouts_apply_and_a_missing_file_is_skipped_silently(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    here = start_with_pth(pth_line(), site, ROOT / "docs", tmp_path)
    assert (here.stdout.strip(), here.stderr) == (str(ROOT / ".prefect"), "")
    gone = start_with_pth(pth_line(tmp_path / "moved" / "project_env.py"), site, ROOT / "docs", tmp_path)
    assert (gone.stdout.strip(), gone.stderr) == ("None", "")


def test_install_replaces_the_line_an_older_install_wrote(tmp_path: Path) -> None:
    (tmp_path / PTH_NAME).write_text("import eagle3.project_env as _e3; _e3.apply()\n")
    assert install(tmp_path) == tmp_path / PTH_NAME
    assert (tmp_path / PTH_NAME).read_text() == pth_line()
    assert [p.name for p in tmp_path.iterdir()] == [PTH_NAME]
