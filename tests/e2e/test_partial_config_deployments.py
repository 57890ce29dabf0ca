"""Every deployment that takes `config`, registered on a real Prefect server as `make serve` registers it, and a
run of it given a partial config the way docs/gpu-node.md teaches (`--params '{"config": {"run_dir": ...}}'`): the
server replaces the deployment's whole `config`, and the flow's first step (tasks/deployment_config.py) merges it
back over the deployment's own. A probe flow stands in for the deployment's flow body (training here would take
minutes): it runs that same first step on the real flow run and returns the config the stages would get."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prefect import flow

from eagle3.config import PipelineConfig
from tasks.deployment_config import deployment_config
from tests.deploy_module import deployments_module

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
#: What each deployment sets itself (deploy/prefect.yaml) and a run given only run_dir must keep.
KEPT = {
    "pipeline": {"stages": ["prepare", "synthesize", "extract"], "train.device": "auto"},
    "extract": {"extract.share_run_dir": False},
    "extract-fanout": {"extract.share_run_dir": False},
    "extract-node": {"extract.share_run_dir": True},
    "convert": {"stages": ["convert"]},
    "train": {  # devices `auto`: resolved on the worker the run lands on
        "stages": ["train", "export", "evaluate"],
        "train.device": "auto",
        "server.device": "auto",
        "evaluate.device": "auto",
    },
    "grow": {"stages": ["prepare", "extract", "convert", "train", "export", "evaluate"], "train.init": "previous"},
}


@flow(name="probe-partial-config")
def probe_flow_standing_in(config: PipelineConfig) -> dict[str, Any]:
    merged, sources = deployment_config(config)
    return {"config": merged.model_dump(mode="json"), "sources": sources.model_dump()}


def dotted(tree: dict[str, Any], key: str) -> Any:
    for part in key.split("."):
        tree = tree[part]
    return tree


def test_a_run_given_only_run_dir_keeps_each_deployments_stages_and_devices(prefect_server: str) -> None:
    from prefect.client.orchestration import get_client
    from prefect.flow_engine import run_flow

    d = deployments_module()
    entries = [e for e in d.load_spec()["deployments"] if e["name"] in KEPT]
    assert {e["name"] for e in entries} == set(KEPT)
    with get_client(sync_client=True) as client:
        d.ensure_work_pool(client, "eagle3-gpu", 30)
        for entry in entries:
            _, deployment_id = d.apply_deployment(client, entry, REPO)
            run = client.create_flow_run_from_deployment(
                deployment_id, parameters={"config": {"run_dir": f"data/runs/partial-{entry['name']}"}}
            )
            assert set(run.parameters["config"]) == {"run_dir"}  # Prefect's own merge dropped the deployment's
            out: Any = run_flow(probe_flow_standing_in, flow_run=run, parameters=run.parameters)
            for key, want in KEPT[entry["name"]].items():
                assert dotted(out["config"], key) == want, (entry["name"], key)
            assert out["config"]["run_dir"] == f"data/runs/partial-{entry['name']}"
            assert out["sources"]["given"] == ["run_dir"]
            assert out["sources"]["deployment"].endswith(f"/{entry['name']}")
