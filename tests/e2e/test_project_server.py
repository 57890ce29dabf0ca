"""The project's local server from a fresh shell: after `deploy/prefect_server.sh start` (what `make serve` and
`make demo` run), a shell that only changes into the project directory, with no PREFECT_* variable and a HOME
of its own, reaches that server with the documented `prefect` commands; from another directory,
`source deploy/env.sh` is the one step. No ~/.prefect appears, and no throw-away server is started.

The project is a copy of the files this needs (prefect.toml and the deploy/ scripts; eagle3/ and .venv linked),
so the test runs its own server on a free port and never touches the checkout's .prefect/.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.ports import free_port

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
COPIED = [
    "prefect.toml",
    "deploy/prefect_server.sh",
    "deploy/project_profile.py",
    "deploy/env.sh",
    "deploy/deployments.py",
    "deploy/serve.sh",
]
LINKED = ["eagle3", "flows", ".venv"]


def fresh_shell(script: str, home: Path, cwd: Path = Path("/")) -> subprocess.CompletedProcess[str]:
    """`bash -c script` with nothing from this process's environment but a PATH without the venv."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8"}
    return subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=180)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str, Path]]:
    """(project copy, API URL of its running server, the fresh shells' HOME)."""
    root = tmp_path_factory.mktemp("project")
    proj, home = root / "eagle3-pipeline", root / "home"
    home.mkdir()
    for rel in COPIED:
        (proj / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, proj / rel)
    for rel in LINKED:
        (proj / rel).symlink_to(REPO / rel)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_SERVER_PORT=str(port), HOME=str(home), EAGLE3_STARTED_BY="make demo")
    script = proj / "deploy" / "prefect_server.sh"
    start = subprocess.run(["bash", str(script), "start"], env=env, capture_output=True, text=True, timeout=300)
    try:
        assert start.returncode == 0, f"{start.stdout}\n{start.stderr}"
        assert "project profile 'eagle3'" in start.stdout
        yield proj, f"http://127.0.0.1:{port}/api", home
    finally:
        subprocess.run(["bash", str(script), "stop"], env=env, capture_output=True, text=True, timeout=120)


def register_pipeline_deployment(api_url: str) -> str:
    """The deployment the docs inspect, registered through the REST API (a flow and a deployment row)."""
    flow = httpx.post(f"{api_url}/flows/", json={"name": "pipeline"}, timeout=30).json()
    deployment = httpx.post(
        f"{api_url}/deployments/", json={"name": "pipeline", "flow_id": flow["id"]}, timeout=30
    ).json()
    return str(deployment["id"])


def test_documented_prefect_commands_reach_the_projects_server_from_a_fresh_shell(
    project: tuple[Path, str, Path],
) -> None:
    proj, api_url, home = project
    deployment_id = register_pipeline_deployment(api_url)

    # Only `cd` into the project: prefect.toml -> the project profile -> this server, on its non-default port.
    inspect = fresh_shell(f"cd {proj} && .venv/bin/prefect deployment inspect pipeline/pipeline", home)
    assert inspect.returncode == 0, inspect.stdout + inspect.stderr
    assert deployment_id in inspect.stdout
    show = fresh_shell(f"cd {proj} && .venv/bin/python deploy/deployments.py show", home)
    assert show.returncode == 0 and "deployment     pipeline/pipeline" in show.stdout, show.stderr
    cli = fresh_shell(
        f"cd {proj} && .venv/bin/python -c 'from flows import cli; u = cli.prefect_api_url(); "
        "print(u, cli.check_server(u))'",
        home,
    )
    assert cli.stdout.split() == [api_url, "None"], cli.stderr  # `eagle3 run`/`retry` would use this server

    # From elsewhere: the one documented step, `source deploy/env.sh`.
    elsewhere = fresh_shell(
        f"source {proj}/deploy/env.sh && {proj}/.venv/bin/prefect deployment inspect pipeline/pipeline",
        home,
        cwd=home,
    )
    assert elsewhere.returncode == 0 and deployment_id in elsewhere.stdout, elsewhere.stdout + elsewhere.stderr
    assert not (home / ".prefect").exists()  # Prefect kept its files in the project's .prefect/


def test_without_a_running_server_prefect_says_so_instead_of_starting_a_throwaway_one(
    project: tuple[Path, str, Path], tmp_path: Path
) -> None:
    proj, _, home = project
    bare = tmp_path / "never-served"
    shutil.copytree(proj, bare, symlinks=True, ignore=shutil.ignore_patterns(".prefect"))
    out = fresh_shell(f"cd {bare} && .venv/bin/prefect deployment inspect pipeline/pipeline", home)
    assert out.returncode != 0
    assert "No Prefect API URL provided" in out.stdout + out.stderr
    assert not (bare / ".prefect" / "prefect.db").exists()


def test_make_stop_says_it_also_stops_the_server_make_demo_started(project: tuple[Path, str, Path]) -> None:
    proj, api_url, home = project  # the fixture's server was started as `make demo` starts it
    stop = fresh_shell(f"cd {proj} && PREFECT_SERVER_PORT={httpx.URL(api_url).port} bash deploy/serve.sh stop", home)
    assert stop.returncode == 0, stop.stderr
    assert "started by `make demo`, not `make serve`; stopping it too" in stop.stdout
    assert "prefect server stopped" in stop.stdout
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{api_url}/health", timeout=5)
