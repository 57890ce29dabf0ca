"""deploy/prefect.yaml and deploy/automations/ are valid without a server: every entrypoint loads, every
parameter set (deployment and schedule) validates as the flow's config, the example automation parses, and
the crash automation refuses a window shorter than two heartbeats."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy_module import deployments_module

REPO = Path(__file__).resolve().parents[2]


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
        # extract-node and train-node run once per node at the same time (one run directory, by lease or one torchrun)
        assert entry["concurrency_limit"]["limit"] == (64 if entry["name"] in ("extract-node", "train-node") else 1)
        for s in entry.get("schedules") or []:
            schedule = d.schedule_of(s, flow.fn, entry["name"], None)
            assert not schedule.active
    assert names == {
        "pipeline/pipeline",
        "pipeline/convert",
        "pipeline/grow",
        "train/train",
        "extract/extract",
        "extract/extract-node",
        "extract-fanout/extract-fanout",
        "train-fanout/train-fanout",
        "train-node/train-node",
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


def test_every_flow_run_of_the_project_beats_as_often_as_the_crash_automation_expects() -> None:
    """prefect.toml sets the heartbeat of every flow run started in the project (`eagle3 run` too); Prefect's
    default, 180 s, would let the automation mark live runs Crashed."""
    import tomllib

    d = deployments_module()
    toml = tomllib.loads((REPO / "prefect.toml").read_text())
    assert toml["flows"]["heartbeat_frequency"] == d.HEARTBEAT_S
    assert d.CRASH_AFTER_S >= 2 * d.HEARTBEAT_S


def deployment_forms() -> list[tuple[str, dict[str, Any], Any, dict[str, Any]]]:
    """(name, spec entry, form schema, form parameters) of every deployment in deploy/prefect.yaml."""
    from prefect.flows import load_flow_from_entrypoint

    d = deployments_module()
    forms = []
    for entry in d.load_spec()["deployments"]:
        flow: Any = load_flow_from_entrypoint(str(REPO / entry["entrypoint"]))
        params = d.form_parameters(d.full_parameters(flow.fn, entry.get("parameters"), entry["name"]), entry)
        forms.append((entry["name"], entry, d.form_schema(flow, entry), params))
    return forms


def visible_fields(schema: Any) -> list[tuple[str, dict[str, Any]]]:
    """(dotted name, schema) of every field the form renders: top-level parameters and, through `$ref`s (also
    list items), the fields of the config sections."""
    out: list[tuple[str, dict[str, Any]]] = []

    def walk(prefix: str, props: dict[str, Any]) -> None:
        for name, prop in props.items():
            out.append((prefix + name, prop))
            ref = prop.get("$ref") or prop.get("items", {}).get("$ref")
            if ref:
                walk(f"{prefix}{name}.", schema.definitions[ref.split("/")[-1]]["properties"])

    walk("", schema.properties)
    return out


def test_every_parameter_of_every_deployment_has_a_title_and_a_description() -> None:
    for name, _, schema, _ in deployment_forms():
        for field, prop in visible_fields(schema):
            assert prop.get("title"), f"{name}: {field} has no title"
            assert "_" not in prop["title"], f"{name}: {field} is titled with its raw name {prop['title']!r}"
            assert (prop.get("description") or "").strip(), f"{name}: {field} has no description"
        for param, prop in schema.properties.items():  # no "Property is type None" for a parameter left as is
            assert {"type": "null"} not in prop.get("anyOf", []), f"{name}: parameter {param} defaults to None"


def test_every_form_requires_its_own_run_dir_and_starts_without_one() -> None:
    forms = [(n, s, p) for n, _, s, p in deployment_forms() if "config" in s.properties]
    assert {n for n, _, _ in forms} == {"pipeline", "extract", "extract-fanout", "extract-node", "convert", "train",
                                        "train-fanout", "train-node", "grow"}  # fmt: skip
    for name, schema, params in forms:
        config = schema.definitions["PipelineConfig"]
        assert "run_dir" in config["required"] and "default" not in config["properties"]["run_dir"], name
        if name == "grow":  # its own store, one per model checkpoint: the scheduled runs need it
            assert params["config"]["run_dir"] == "data/runs/traffic-{model_sha}"
            continue
        assert "run_dir" not in params["config"], f"{name}: the form would start with a run directory"


def test_the_config_a_deployment_sets_stays_in_its_parameters_shown_or_not() -> None:
    """The flow merges a run's config over these (tasks/deployment_config.py): convert's stages: [convert] and
    train's stages reach every run, also when the form does not show them; train's devices are left `auto`, to
    follow the worker the run lands on."""
    forms = deployment_forms()
    for name, entry, _, params in forms:
        own = leaf((entry.get("parameters") or {}).get("config") or {})
        assert set(own) <= set(leaf(params.get("config", {}))), name
    convert = next(p for n, _, _, p in forms if n == "convert")
    assert convert["config"]["stages"] == ["convert"]
    train = next(p for n, _, _, p in forms if n == "train")
    assert train["config"]["stages"] == ["train", "export", "evaluate"]
    assert "server" not in train["config"] and "evaluate" not in train["config"]  # devices follow the worker


def test_each_form_shows_only_the_config_its_stages_read() -> None:
    shown = {n: set(s.definitions["PipelineConfig"]["properties"]) for n, _, s, _ in deployment_forms() if
             "config" in s.properties}  # fmt: skip
    assert shown["pipeline"] == {"run_dir", "model", "stages", "data"}
    assert shown["extract"] == {"run_dir", "model", "server"}
    assert shown["train"] == {"run_dir", "model", "train"}
    assert shown["convert"] == {"run_dir", "model", "stages"}


def test_each_form_holds_a_handful_of_fields_and_the_rest_in_overrides() -> None:
    """Issue 34: the pipeline form had 61 fields, grow 120; now what a first run changes, the rest by name."""
    for name, entry, schema, params in deployment_forms():
        if "config" not in schema.properties:
            continue
        fields = [f for f, prop in visible_fields(schema) if "$ref" not in prop]
        assert len(fields) <= 9, f"{name}: {len(fields)} fields: {fields}"
        assert "overrides" in schema.properties, name
        own = leaf(entry.get("parameters", {}).get("config") or {})
        assert set(leaf(params["config"])) - set(own) <= {f.removeprefix("config.") for f in fields}, name


def leaf(tree: dict[str, Any], prefix: str = "") -> list[str]:
    out: list[str] = []
    for k, v in tree.items():
        out += leaf(v, f"{prefix}{k}.") if isinstance(v, dict) else [prefix + k]
    return out


def doc_deployments() -> set[tuple[str, str]]:
    """(`flow/deployment`, entrypoint) of every row of docs/gpu-node.md's deployment table."""
    rows = set()
    for line in (REPO / "docs" / "gpu-node.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and re.fullmatch(r"`[\w-]+/[\w-]+`", cells[0]) and cells[1].endswith("`"):
            rows.add((cells[0].strip("`"), cells[1].strip("`")))
    return rows


def test_the_deployments_in_the_docs_are_the_ones_in_prefect_yaml() -> None:
    from prefect.flows import load_flow_from_entrypoint

    d = deployments_module()
    spec = set()
    for entry in d.load_spec()["deployments"]:
        flow: Any = load_flow_from_entrypoint(str(REPO / entry["entrypoint"]))
        spec.add((f"{flow.name}/{entry['name']}", entry["entrypoint"]))
    assert doc_deployments() == spec
    readme = (REPO / "README.md").read_text()
    listed = re.search(r"the deployments \(([^)]*)\)", " ".join(readme.split()))
    assert listed is not None, "README: the `make serve` paragraph lists the deployments"
    assert {n.strip() for n in listed.group(1).split(",")} == {name.split("/")[1] for name, _ in spec}
