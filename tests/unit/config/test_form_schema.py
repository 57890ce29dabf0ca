"""The deployments' forms have no str/None switch ("Property is type None" in Prefect's UI): every `X | None`
config key is a plain X field, and what the forms, the schedules and extract-fanout send still passes the
server's own parameter validation (Prefect's `validate`, as `enforce_parameter_schema` runs it)."""

from __future__ import annotations

import typing
from typing import Any

import pytest
from pydantic import BaseModel

from eagle3.config import PipelineConfig
from tests.unit.test_config_merge import REPO, deployments_module


def nullable_fields(model: type[BaseModel], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        args = typing.get_args(field.annotation)
        if type(None) in args:
            out[prefix + name] = field.get_default(call_default_factory=True)
        for a in args or (field.annotation,):
            for inner in (a, *typing.get_args(a)):
                if isinstance(inner, type) and issubclass(inner, BaseModel):
                    out.update(nullable_fields(inner, f"{prefix}{name}."))
    return out


def test_every_nullable_config_key_defaults_to_none_so_leaving_it_out_loses_nothing() -> None:
    fields = nullable_fields(PipelineConfig)
    assert "train.max_steps" in fields and "server.url" in fields
    assert {k: v for k, v in fields.items() if v is not None} == {}


@pytest.mark.parametrize("entry", deployments_module().load_spec()["deployments"], ids=lambda e: e["name"])
def test_no_form_field_offers_a_null_choice_and_what_is_sent_validates(entry: dict[str, Any]) -> None:
    from prefect.flows import load_flow_from_entrypoint
    from prefect.utilities.schema_tools.validation import validate

    d = deployments_module()
    flow: Any = load_flow_from_entrypoint(str(REPO / entry["entrypoint"]))
    schema = d.form_schema(flow, entry).model_dump()
    for name, definition in schema["definitions"].items():
        for key, prop in (definition.get("properties") or {}).items():
            assert {"type": "null"} not in prop.get("anyOf", []), f"{name}.{key}"
    params = d.form_parameters(d.full_parameters(flow.fn, entry.get("parameters"), entry["name"]), entry)
    if "config" not in params:
        return
    assert "None" not in repr(params)  # the form starts without nulls
    params["config"]["run_dir"] = "data/runs/x"
    validate(params, schema, raise_on_error=True)
    explicit_null = {"config": {"run_dir": "data/runs/x", "train": {"max_steps": None}, "server": {"url": None}}}
    validate(explicit_null, schema, raise_on_error=True)  # `--params` with a null still passes (Prefect's own rule)


def test_the_pipeline_form_says_what_its_defaults_cost_on_a_cpu_worker() -> None:
    from prefect.flows import load_flow_from_entrypoint

    d = deployments_module()
    (entry,) = [e for e in d.load_spec()["deployments"] if e["name"] == "pipeline"]
    flow: Any = load_flow_from_entrypoint(str(REPO / entry["entrypoint"]))
    described = d.form_schema(flow, entry).model_dump()["properties"]["config"]["description"]
    assert described.startswith("On a CPU worker these defaults take over 30 min")


def test_a_form_hidden_parameter_is_left_off_the_form_and_a_parent_may_still_pass_it() -> None:
    from prefect.flows import load_flow_from_entrypoint
    from prefect.utilities.schema_tools.validation import validate

    d = deployments_module()
    (entry,) = [e for e in d.load_spec()["deployments"] if e["name"] == "train-node"]
    flow: Any = load_flow_from_entrypoint(str(REPO / entry["entrypoint"]))
    schema = d.form_schema(flow, entry).model_dump()
    assert entry["form_hidden"] == ["rendezvous_token", "gpu_limit"]
    assert not set(entry["form_hidden"]) & set(schema["properties"]) and "config" in schema["properties"]
    sent = {"config": {"run_dir": "data/runs/x"}, "rendezvous_token": "abc", "gpu_limit": "gpu-node-1"}
    validate(sent, schema, raise_on_error=True)  # what train-fanout sends its nodes (enforce_parameter_schema)
    with pytest.raises(d.SpecError, match=r"form_hidden names parameters the flow does not have: \['nope'\]"):
        d.form_schema(flow, {**entry, "form_hidden": ["nope"]})
