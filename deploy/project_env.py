"""The project's Prefect settings from anywhere inside the project, not only at its root.

Prefect reads prefect.toml from the current directory only, so `cd docs && ../.venv/bin/prefect ...` would miss
it: another home (~/.prefect), no server address, a throw-away server on another port. The project's venv runs
`apply()` at every interpreter start (a .pth file that `install()` writes, `make venv` calls it; its one line runs
this file by its absolute path, and does nothing once the file is gone): inside the
project tree but below its root, each setting of prefect.toml becomes its PREFECT_* environment variable (nested
keys joined by "_", as Prefect names them; relative paths resolved against the root). prefect.toml stays the one
place the settings live. Variables already exported win, as they do over prefect.toml; outside the project
nothing changes.

    python deploy/project_env.py install     # write the .pth into this interpreter's site-packages
"""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]  # the checkout: deploy/..
SETTINGS = ROOT / "prefect.toml"
PTH_NAME = "eagle3_project_env.pth"  # the name an older install used too: install() replaces its line
PATH_KEYS = {"home", "profiles_path"}  # values that are paths, relative to the project root


def settings_env(settings: dict[str, Any], prefix: str = "PREFECT") -> dict[str, str]:
    """prefect.toml's settings as Prefect's environment variables ({"server": {"ephemeral": {"enabled": False}}}
    -> PREFECT_SERVER_EPHEMERAL_ENABLED=false)."""
    out: dict[str, str] = {}
    for key, value in settings.items():
        name = f"{prefix}_{key.upper()}"
        if isinstance(value, dict):
            out |= settings_env(value, name)
        elif isinstance(value, bool):
            out[name] = "true" if value else "false"
        elif key in PATH_KEYS:
            out[name] = str(ROOT / value)
        else:
            out[name] = str(value)
    return out


def apply(cwd: Path | None = None) -> dict[str, str]:
    """Export prefect.toml's settings when `cwd` is below the project root; returns what it set."""
    try:
        here = (cwd or Path.cwd()).resolve()
    except OSError:  # a deleted working directory
        return {}
    if here == ROOT or ROOT not in here.parents or not SETTINGS.is_file():
        return {}
    import tomllib  # here, not at the top: every start of the venv's interpreter imports this module

    with SETTINGS.open("rb") as f:
        wanted = settings_env(tomllib.load(f))
    added = {k: v for k, v in wanted.items() if k not in os.environ}
    os.environ.update(added)
    return added


def pth_line(script: Path | None = None) -> str:
    """The .pth line that runs `script`'s (this file's) apply() at interpreter start; a file that is gone (a moved or
    deleted checkout) is skipped without a word."""
    path = str((script or Path(__file__)).resolve())
    return (
        f"import os, runpy; _e3 = {path!r}; "
        "os.path.isfile(_e3) and runpy.run_path(_e3, run_name='eagle3_project_env')['apply']()\n"
    )


def install(site: Path | None = None) -> Path:
    """Write the .pth that runs apply() at interpreter start into `site` (this interpreter's site-packages),
    replacing what an earlier install wrote there (`import eagle3.project_env ...`, before this file moved here)."""
    pth = (site or Path(sysconfig.get_paths()["purelib"])) / PTH_NAME
    line = pth_line()
    if not pth.is_file() or pth.read_text() != line:
        pth.write_text(line)
    return pth


if __name__ == "__main__":
    if sys.argv[1:] != ["install"]:
        sys.exit("usage: python deploy/project_env.py install")
    print(f"project_env: {install()}")
