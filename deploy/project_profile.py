"""Point the project profile at the local server (deploy/prefect_server.sh runs this when it starts the project's
own server): profile `eagle3` in <project>/.prefect/profiles.toml, with PREFECT_API_URL set, made active. The
project's prefect.toml names that file, so `prefect ...` and `eagle3 ...` in the project directory reach the
server with nothing exported (docs/gpu-node.md). Other profiles in the file are kept.

    python deploy/project_profile.py http://127.0.0.1:4200/api [--profiles .prefect/profiles.toml]
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path
from typing import Any

import toml

PROJECT_DIR = Path(__file__).resolve().parents[1]
PROFILES = PROJECT_DIR / ".prefect" / "profiles.toml"
PROFILE = "eagle3"

if str(PROJECT_DIR) not in sys.path:  # run as a script: eagle3/ importable
    sys.path.insert(0, str(PROJECT_DIR))

from eagle3.store.fsio import atomic_write_text  # noqa: E402


def point_profile(api_url: str, path: Path = PROFILES) -> dict[str, Any]:
    """Set PREFECT_API_URL of profile `eagle3` in `path` and make it the active one; returns the file's content."""
    data: dict[str, Any] = tomllib.loads(path.read_text()) if path.exists() else {}
    profiles = data.setdefault("profiles", {})
    profiles.setdefault(PROFILE, {})["PREFECT_API_URL"] = api_url
    data["active"] = PROFILE
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, toml.dumps(data))
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("api_url", help="the local server's API, e.g. http://127.0.0.1:4200/api")
    parser.add_argument(
        "--profiles", type=Path, default=PROFILES, help="profiles file (default .prefect/profiles.toml)"
    )
    args = parser.parse_args(argv)
    point_profile(args.api_url, args.profiles)
    print(f"  project profile {PROFILE!r} ({args.profiles}): PREFECT_API_URL={args.api_url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
