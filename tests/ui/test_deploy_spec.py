"""deploy/prefect.yaml and deploy/automations/ are valid without a server: every entrypoint loads, every
parameter set (deployment and schedule) validates as the flow's config, the example automation parses, and
the crash automation refuses a window shorter than two heartbeats."""

from __future__ import annotations

import importlib.util
import sys
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


def deployments_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("eagle3_deployments", REPO / "deploy" / "deployments.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_every_deployment_loads_and_its_parameters_and_schedules_validate() -> None:
    from prefect.flows import load_flow_from_entrypoint

    d = deployments_module()
    spec = d.load_spec()
    assert d.pool_names(spec) == ["eagle3-gpu"]
    names = set()
    for entry in spec["deployments"]:
        flow: Any = load_flow_from_entrypoint(str(REPO / entry["entrypoint"]))
        names.add(f"{flow.name}/{entry['name']}")
        params = d.full_parameters(flow.fn, entry.get("parameters"), entry["name"])
        if "config" in params:
            assert params["config"]["data"]["shard_size"] > 0  # written out in full for the UI form
        # extract-node runs once per node at the same time (its runs share a run directory by lease)
        assert entry["concurrency_limit"]["limit"] == (64 if entry["name"] == "extract-node" else 1)
        for s in entry.get("schedules") or []:
            schedule = d.schedule_of(s, flow.fn, entry["name"], None)
            assert not schedule.active
    assert names == {
        "eagle3-pipeline/pipeline",
        "eagle3-pipeline/convert",
        "eagle3-pipeline/grow",
        "eagle3-train/train",
        "extract/extract",
        "extract/extract-node",
        "extract-fanout/extract-fanout",
        "retry-failed/retry-failed",
        "verify/verify",
    }


def test_a_bad_parameter_in_the_spec_is_refused_naming_the_deployment() -> None:
    from flows.pipeline import pipeline

    d = deployments_module()
    with pytest.raises(d.SpecError, match=r"(?s)nightly: parameter 'config'.*data.shard_size"):
        d.full_parameters(pipeline.fn, {"config": {"data": {"shard_size": 0}}}, "nightly")


def test_the_example_automation_parses_as_a_disabled_run_deployment_automation() -> None:
    from prefect.automations import AutomationCore

    raw = yaml.safe_load((REPO / "deploy" / "automations" / "retry-failed-shards.yaml").read_text())
    (action,) = raw["actions"]
    assert action.pop("deployment") == "retry-failed/retry-failed"
    action.update(source="selected", deployment_id=str(uuid.uuid4()))
    automation = AutomationCore.model_validate(raw)
    assert not automation.enabled
    assert automation.trigger.expect == {"eagle3.shard.failed"}  # type: ignore[union-attr]


def test_the_crash_automation_needs_at_least_two_heartbeats() -> None:
    d = deployments_module()
    assert d.crash_automation(30, 150).trigger.within.total_seconds() == 150
    with pytest.raises(d.SpecError, match="at least two heartbeats"):
        d.crash_automation(30, 45)
