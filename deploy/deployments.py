"""Register the project's Prefect objects on the server in PREFECT_API_URL (idempotent; `make serve` runs it):

    process work pool `eagle3-gpu`   flow runs start in the project directory, with flow-run heartbeats on
    global concurrency limit `gpu`   sized to this node (nvidia-smi, at least 1; --gpus to set it)
    deployments                      deploy/prefect.yaml, by entrypoint, source = this project directory; each
                                     form titles and describes every parameter, requires its own
                                     `config.run_dir` and shows only its `config_form` keys (and no
                                     `form_hidden` parameter)
    automation "crash-zombie-runs"   a Running flow run whose heartbeats stop is marked Crashed (open-source
                                     Prefect does not ship it), so it no longer holds its concurrency slots
    example automations              deploy/automations/*.yaml, created disabled; enable them in the UI

    python deploy/deployments.py apply [--gpus N] [--heartbeat-s 30] [--crash-after-s 150]
    python deploy/deployments.py show      # what is registered
    python deploy/deployments.py crash-automation [--crash-after-s 150]   # only the automation (every server
                                                  # deploy/prefect_server.sh starts gets it: `make demo`'s too)

A re-apply updates everything in place but keeps what a user switched in the UI: a schedule's on/off
state and an example automation's enabled state.
"""

from __future__ import annotations

import argparse
import copy
import inspect
import shutil
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

PROJECT_DIR = Path(__file__).resolve().parents[1]
SPEC = PROJECT_DIR / "deploy" / "prefect.yaml"
AUTOMATIONS_DIR = PROJECT_DIR / "deploy" / "automations"
CRASH_AUTOMATION = "crash-zombie-runs"
HEARTBEAT_S = 30  # Prefect's minimum; its default is 180
CRASH_AFTER_S = 150  # five missed heartbeats

if str(PROJECT_DIR) not in sys.path:  # run as a script: make flows/, tasks/, eagle3/ importable
    sys.path.insert(0, str(PROJECT_DIR))


class SpecError(ValueError):
    """deploy/prefect.yaml (or an automation file) does not describe what this module can register."""


def load_spec(path: Path = SPEC) -> dict[str, Any]:
    spec = yaml.safe_load(path.read_text())
    if not isinstance(spec, dict) or not isinstance(spec.get("deployments"), list):
        raise SpecError(f"{path}: expected a mapping with a `deployments` list")
    for d in spec["deployments"]:
        missing = [k for k in ("name", "entrypoint", "work_pool") if k not in d]
        if missing:
            raise SpecError(f"{path}: deployment {d.get('name', '?')!r} lacks {missing}")
    return spec


def pool_names(spec: dict[str, Any]) -> list[str]:
    return sorted({d["work_pool"]["name"] for d in spec["deployments"]})


def count_gpus() -> int:
    """GPUs on this node (`nvidia-smi -L`), at least 1 so a CPU node can still run one job at a time."""
    if shutil.which("nvidia-smi") is None:
        return 1
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return 1
    return max(1, sum(1 for line in out.splitlines() if line.startswith("GPU ")))


# --- parameters -----------------------------------------------------------------------------------------------


def model_parameters(fn: Any) -> dict[str, type[BaseModel]]:
    """The flow function's parameters annotated with a pydantic model (e.g. `config: PipelineConfig`)."""
    hints = inspect.get_annotations(fn, eval_str=True)
    return {
        name: hints[name]
        for name in inspect.signature(fn).parameters
        if inspect.isclass(hints.get(name)) and issubclass(hints[name], BaseModel)
    }


def full_parameters(fn: Any, given: dict[str, Any] | None, where: str) -> dict[str, Any]:
    """`given`, with every pydantic-model parameter validated and written out in full (defaults included, but
    no None: the form's nullable fields have no null choice, see `plain_nullable`), so the UI's form starts from
    complete values and a bad value in prefect.yaml fails here, not at run time."""
    from eagle3.config_merge import without_nulls

    params = copy.deepcopy(given or {})
    for name, model in model_parameters(fn).items():
        try:
            params[name] = without_nulls(model.model_validate(params.get(name) or {}).model_dump(mode="json"))
        except ValueError as e:
            raise SpecError(f"{where}: parameter {name!r} does not validate as {model.__name__}:\n{e}") from None
    return params


# --- the UI form ----------------------------------------------------------------------------------------------

#: Titles for flow parameters whose title-cased name (`run_dir` -> "Run Dir", as pydantic titles config fields)
#: reads badly.
TITLES = {"poll_s": "Poll Interval (s)"}
#: Which stages read each config section: the form says so, so a section a run's stages never read is clearly
#: one to leave alone.
SECTION_STAGES = {
    "prompts": "prompts",
    "data": "prepare",
    "synthesize": "synthesize",
    "server": "synthesize, extract, train, evaluate",
    "extract": "extract",
    "disk": "extract",
    "train": "convert, train",
    "evaluate": "export, evaluate",
}
RUN_DIR_HELP = (
    "Required: a directory of this run's own, e.g. `data/runs/k2-2026-12-01` (relative to the project "
    "directory). A run given another run's directory adds to that store, or is refused when its data or "
    "settings differ."
)


def title_of(name: str) -> str:
    return TITLES.get(name) or name.replace("_", " ").title()


def plain_nullable(definitions: dict[str, Any]) -> None:
    """Each `X | None` property of the config's models as plain X, default None left out: Prefect's form shows
    `anyOf [X, null]` as a switch with "Property is type None" beside it. An empty field is left out of the run's
    parameters, and the key then has its default, None (every nullable config key defaults to None)."""
    for definition in definitions.values():
        for name, prop in (definition.get("properties") or {}).items():
            choices = prop.get("anyOf") or []
            plain = [c for c in choices if c.get("type") != "null"]
            if len(choices) == 2 and len(plain) == 1:
                rest = {k: v for k, v in prop.items() if k != "anyOf" and not (k == "default" and v is None)}
                definition["properties"][name] = {**plain[0], **rest}


def leaf_keys(tree: dict[str, Any], prefix: str = "") -> list[str]:
    out: list[str] = []
    for k, v in tree.items():
        out += leaf_keys(v, f"{prefix}{k}.") if isinstance(v, dict) and v else [prefix + k]
    return out


def is_shown(key: str, shown: list[str]) -> bool:
    """Whether the form shows config key `key` (dotted): it, a section above it or a field below it is listed."""
    return any(key == s or key.startswith(s + ".") or s.startswith(key + ".") for s in shown)


def known_key(definitions: dict[str, Any], dotted: str) -> bool:
    """Whether `section.field` (or a top-level key) is a PipelineConfig key, through the sections' `$ref`s."""
    props = definitions["PipelineConfig"]["properties"]
    *parents, leaf = dotted.split(".")
    for p in parents:
        ref = props.get(p, {}).get("$ref")
        if not ref:
            return False
        props = definitions[ref.split("/")[-1]]["properties"]
    return leaf in props


def form_schema(flow: Any, d: dict[str, Any]) -> Any:
    """The flow's parameter schema as the deployment's UI form shows it: every parameter titled and described
    (descriptions come from the flow docstring's `Args:` section), `config.run_dir` required and empty (a run
    started without edits never lands in another run's store), and, with `config_form` in the spec, only
    those config keys (the others keep their defaults; a caller may still pass them). `form_note`: a sentence put
    first in the `config` description, which the Run form shows (the Description tab is not on the form).
    `form_hidden`: flow parameters the form leaves out (a fan-out's child deployment and poll interval: they keep
    their defaults; `--params` and a parent flow still pass them, the schema allows other keys)."""
    from prefect.utilities.callables import parameter_schema

    where = f"deployment {d['name']!r} ({d['entrypoint']})"
    schema = parameter_schema(flow.fn)
    hidden = d.get("form_hidden") or []
    if unknown := sorted(set(hidden) - set(schema.properties)):
        raise SpecError(f"{where}: form_hidden names parameters the flow does not have: {unknown}")
    if required := sorted(set(hidden) & set(schema.required or [])):
        raise SpecError(f"{where}: form_hidden names required parameters: {required}")
    for name in hidden:
        del schema.properties[name]
    for name, prop in schema.properties.items():
        if not prop.get("description"):
            raise SpecError(f"{where}: parameter {name!r} has no description; add it to the flow's `Args:` docstring")
        prop["title"] = title_of(name)
        prop["description"] = " ".join(prop["description"].split())
    if note := d.get("form_note"):  # what a first run must know before it starts, on the Run form itself
        config_param = schema.properties["config"]
        config_param["description"] = f"{' '.join(note.split())} {config_param['description']}"
    config = schema.definitions.get("PipelineConfig")
    if config is not None and "config" in model_parameters(flow.fn):
        plain_nullable(schema.definitions)
        shown = d.get("config_form")
        props = config["properties"]
        unknown = sorted(k for k in shown or [] if not known_key(schema.definitions, k))
        if unknown:
            raise SpecError(f"{where}: config_form names keys PipelineConfig does not have: {unknown}")
        # A value the deployment sets but its form does not show (train.device: cuda) still reaches every run: it
        # stays in the deployment's parameters (form_parameters) and the flow merges a run's config over them.
        if shown:
            config["properties"] = props = {k: v for k, v in props.items() if is_shown(k, shown)}
            config.pop("additionalProperties", None)  # callers (extract-fanout) pass the whole config
            for key, prop in props.items():  # a section of which only some fields are listed shows only those
                fields = [k.split(".", 1)[1] for k in shown if k.startswith(key + ".")]
                if fields and key not in shown:
                    section = schema.definitions[prop["$ref"].split("/")[-1]]
                    section["properties"] = {k: v for k, v in section["properties"].items() if k in fields}
                    section.pop("additionalProperties", None)
                    section.pop("required", None)
        props["run_dir"].pop("default", None)
        props["run_dir"]["description"] = RUN_DIR_HELP
        config["required"] = sorted({*config.get("required", []), "run_dir"})
        for key, stages in SECTION_STAGES.items():
            if key in props:
                section = schema.definitions[props[key]["$ref"].split("/")[-1]]
                who = f"the stages {stages} read" if "," in stages else f"the {stages} stage reads"
                props[key]["title"] = title_of(key)  # the label the UI gives it anyway: "Extract"
                props[key]["description"] = (
                    f"{section.get('description', '')} Only {who} this section; its other keys: `Overrides`."
                )
    return schema


def form_parameters(params: dict[str, Any], d: dict[str, Any]) -> dict[str, Any]:
    """The deployment's parameters as the form starts: without `config.run_dir` (the user names it; unless the
    spec itself gives one, as `grow` does with a `{model_sha}` template: its scheduled runs need it) and without
    the config keys the form does not show, except those the deployment sets itself (the flow merges a run's
    config over them, so they reach every run)."""
    if "config" not in params:
        return params
    shown = d.get("config_form")
    own = set(leaf_keys((d.get("parameters") or {}).get("config") or {}))
    config = {k: v for k, v in params["config"].items() if (k != "run_dir" or "run_dir" in own)}

    def keep(tree: dict[str, Any], prefix: str) -> dict[str, Any]:
        out = {}
        for k, v in tree.items():
            key = prefix + k
            if isinstance(v, dict) and v and not any(key == s for s in shown or []):
                if sub := keep(v, key + "."):
                    out[k] = sub
            elif any(key == s or key.startswith(s + ".") for s in shown or []) or key in own:
                out[k] = v
        return out

    return {**params, "config": keep(config, "") if shown else config}


# --- work pool and limits -------------------------------------------------------------------------------------


def ensure_work_pool(client: Any, name: str, heartbeat_s: int) -> None:
    """A `process` pool whose flow runs send heartbeats every `heartbeat_s` (the crash automation needs them)."""
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.workers.process import ProcessWorker

    template = ProcessWorker.get_default_base_job_template()
    env = template["variables"]["properties"]["env"]
    env["default"] = {"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(heartbeat_s)}
    pool = WorkPoolCreate(
        name=name,
        type="process",
        description="GPU node(s) of the EAGLE-3 pipeline: one `prefect worker start --pool` per node.",
        base_job_template=template,
    )
    client.create_work_pool(pool, overwrite=True)


def ensure_gpu_limit(client: Any, gpus: int) -> str:
    """The global concurrency limit the train task holds (tasks/train.py GPU_LIMIT, its one home), sized to `gpus`;
    returns its name."""
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, GlobalConcurrencyLimitUpdate
    from prefect.exceptions import ObjectNotFound

    from tasks.train import GPU_LIMIT

    try:
        client.read_global_concurrency_limit_by_name(GPU_LIMIT)
    except ObjectNotFound:
        client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=GPU_LIMIT, limit=gpus))
    else:
        client.update_global_concurrency_limit(GPU_LIMIT, GlobalConcurrencyLimitUpdate(limit=gpus, active=True))
    return GPU_LIMIT


# --- deployments ----------------------------------------------------------------------------------------------


def schedule_of(s: dict[str, Any], fn: Any, where: str, active: bool | None) -> Any:
    from prefect.schedules import Cron, Interval

    kwargs: dict[str, Any] = {
        "timezone": s.get("timezone"),
        "active": s.get("active", True) if active is None else active,
        "parameters": full_parameters(fn, s.get("parameters"), where) if s.get("parameters") else None,
        "slug": s.get("slug"),
    }
    if "cron" in s:
        return Cron(s["cron"], **kwargs)
    if "interval" in s:
        # anchor_date (ISO 8601): when the ticks start (Prefect's default: the moment the schedule is created).
        try:
            anchor = datetime.fromisoformat(str(s["anchor_date"])) if s.get("anchor_date") else None
        except ValueError as e:
            raise SpecError(f"{where}: anchor_date must be an ISO 8601 date-time, e.g. 2026-12-04T02:00:00Z") from e
        return Interval(timedelta(seconds=float(s["interval"])), anchor_date=anchor, **kwargs)
    raise SpecError(f"{where}: a schedule needs `cron` or `interval` (got {sorted(s)})")


def existing_schedule_states(client: Any, full_name: str) -> dict[str, bool]:
    """slug -> active of the deployment's schedules on the server (what the UI's toggle says)."""
    from prefect.exceptions import ObjectNotFound

    try:
        deployment = client.read_deployment_by_name(full_name)
    except ObjectNotFound:
        return {}
    return {s.slug: s.active for s in deployment.schedules if s.slug}


def apply_deployment(client: Any, d: dict[str, Any], project_dir: Path) -> tuple[str, Any]:
    from prefect.client.schemas.objects import ConcurrencyLimitConfig
    from prefect.deployments.runner import RunnerDeployment
    from prefect.flows import load_flow_from_entrypoint
    from prefect.runner.storage import LocalStorage

    where = f"deployment {d['name']!r} ({d['entrypoint']})"
    flow: Any = load_flow_from_entrypoint(str(project_dir / d["entrypoint"]))
    full_name = f"{flow.name}/{d['name']}"
    active = existing_schedule_states(client, full_name)
    schedules = [schedule_of(s, flow.fn, where, active.get(s.get("slug", ""))) for s in d.get("schedules") or []]
    limit = d.get("concurrency_limit")
    deployment: Any = RunnerDeployment.from_storage(  # sync here (async_dispatch)
        storage=LocalStorage(str(project_dir)),
        entrypoint=d["entrypoint"],
        name=d["name"],
        description=d.get("description"),
        tags=d.get("tags") or [],
        parameters=form_parameters(full_parameters(flow.fn, d.get("parameters"), where), d),
        schedules=schedules,
        concurrency_limit=ConcurrencyLimitConfig(**limit) if isinstance(limit, dict) else limit,
        work_pool_name=d["work_pool"]["name"],
        work_queue_name=d["work_pool"].get("work_queue_name"),
        job_variables=d["work_pool"].get("job_variables") or {},
        enforce_parameter_schema=True,
    )
    deployment._parameter_openapi_schema = form_schema(flow, d)  # titles, descriptions, required run_dir
    return full_name, deployment.apply()


# --- automations ----------------------------------------------------------------------------------------------


def crash_automation(heartbeat_s: int, crash_after_s: int) -> Any:
    """Mark a flow run Crashed when no heartbeat (and no final state) followed its last heartbeat within
    `crash_after_s` (Prefect's recipe for zombie runs; heartbeats come every `heartbeat_s`)."""
    from prefect.automations import AutomationCore
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import EventTrigger, Posture
    from prefect.events.schemas.events import ResourceSpecification

    if crash_after_s < 2 * heartbeat_s:
        raise SpecError(f"--crash-after-s {crash_after_s} must be at least two heartbeats (2 x {heartbeat_s} s)")
    return AutomationCore(
        name=CRASH_AUTOMATION,
        description=(
            f"Flow runs send a heartbeat every {heartbeat_s} s (work pool env PREFECT_FLOWS_HEARTBEAT_FREQUENCY). "
            f"A run with no heartbeat and no final state for {crash_after_s} s lost its process (node down, "
            "OOM kill of the worker): mark it Crashed so it frees its deployment and `gpu` slots."
        ),
        enabled=True,
        trigger=EventTrigger(
            after={"prefect.flow-run.heartbeat"},
            expect={
                "prefect.flow-run.heartbeat",
                "prefect.flow-run.Completed",
                "prefect.flow-run.Failed",
                "prefect.flow-run.Cancelled",
                "prefect.flow-run.Crashed",
            },
            match=ResourceSpecification({"prefect.resource.id": ["prefect.flow-run.*"]}),
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=crash_after_s),
        ),
        actions=[
            ChangeFlowRunState(
                name="Crashed",
                state=StateType.CRASHED,
                message=f"No heartbeat for {crash_after_s} s: the flow run's process is gone ({CRASH_AUTOMATION}).",
                force=False,
            )
        ],
    )


def automation_from_file(client: Any, path: Path) -> Any:
    """An automation file is Prefect's automation schema, except that a run-deployment action names its
    deployment (`deployment: flow/deployment`) instead of giving its id."""
    from prefect.automations import AutomationCore

    raw = yaml.safe_load(path.read_text())
    for action in raw.get("actions", []):
        if "deployment" in action:
            name = action.pop("deployment")
            action["source"] = "selected"
            action["deployment_id"] = str(client.read_deployment_by_name(name).id)
    try:
        return AutomationCore.model_validate(raw)
    except ValueError as e:
        raise SpecError(f"{path}: not a valid automation:\n{e}") from None


def upsert_automation(client: Any, automation: Any, keep_enabled: bool) -> str:
    """Create, or update in place (by name). With `keep_enabled`, an existing automation keeps the enabled
    state a user gave it in the UI."""
    found = client.read_automations_by_name(automation.name)
    if not found:
        client.create_automation(automation)
        return "created" + ("" if automation.enabled else " (disabled)")
    current = found[0]
    if keep_enabled:
        automation = automation.model_copy(update={"enabled": current.enabled})
    client.update_automation(current.id, automation)
    for extra in found[1:]:  # duplicates from an older, non-idempotent registration
        client.delete_automation(extra.id)
    return "updated" + ("" if automation.enabled else " (disabled)")


# --- commands -------------------------------------------------------------------------------------------------


def apply(gpus: int | None, heartbeat_s: int, crash_after_s: int, spec_path: Path = SPEC) -> None:
    from prefect import get_client

    spec = load_spec(spec_path)
    gpus = gpus or count_gpus()
    with get_client(sync_client=True) as client:
        for pool in pool_names(spec):
            ensure_work_pool(client, pool, heartbeat_s)
            print(f"work pool      {pool} (process; flow-run heartbeat every {heartbeat_s} s)")
        limit = ensure_gpu_limit(client, gpus)
        print(f"global limit   {limit} = {gpus}")
        for d in spec["deployments"]:
            full_name, deployment_id = apply_deployment(client, d, PROJECT_DIR)
            print(f"deployment     {full_name} ({deployment_id})")
        status = upsert_automation(client, crash_automation(heartbeat_s, crash_after_s), keep_enabled=False)
        print(f"automation     {CRASH_AUTOMATION}: {status}")
        for path in sorted(AUTOMATIONS_DIR.glob("*.yaml")):
            automation = automation_from_file(client, path)
            status = upsert_automation(client, automation, keep_enabled=True)
            print(f"automation     {automation.name}: {status} (deploy/automations/{path.name})")


def apply_crash_automation(heartbeat_s: int, crash_after_s: int) -> int:
    from prefect import get_client

    try:
        automation = crash_automation(heartbeat_s, crash_after_s)
    except SpecError as e:
        print(f"deployments: {e}", file=sys.stderr)
        return 1
    with get_client(sync_client=True) as client:
        status = upsert_automation(client, automation, keep_enabled=False)
    print(f"automation     {CRASH_AUTOMATION}: {status}")
    return 0


def show() -> None:
    from prefect import get_client

    with get_client(sync_client=True) as client:
        for pool in client.read_work_pools():
            print(f"work pool      {pool.name} ({pool.type})")
        for limit in client.read_global_concurrency_limits():
            if not limit.name.startswith("deployment:"):  # Prefect's own, behind each deployment's limit
                print(f"global limit   {limit.name} = {limit.limit}")
        flows = {f.id: f.name for f in client.read_flows()}
        for dep in client.read_deployments():
            schedules = ", ".join(f"{s.slug or s.id}: {'on' if s.active else 'off'}" for s in dep.schedules)
            print(f"deployment     {flows.get(dep.flow_id, '?')}/{dep.name}" + (f" [{schedules}]" if schedules else ""))
        for a in client.read_automations():
            print(f"automation     {a.name}: {'enabled' if a.enabled else 'disabled'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    a = sub.add_parser("apply", help="create or update the pool, limits, deployments and automations")
    a.add_argument("--gpus", type=int, default=None, help="size of the `gpu` limit (default: nvidia-smi, >= 1)")
    a.add_argument("--heartbeat-s", type=int, default=HEARTBEAT_S, help="flow-run heartbeat period (>= 30)")
    a.add_argument("--crash-after-s", type=int, default=CRASH_AFTER_S, help="silence that marks a run Crashed")
    a.add_argument("--spec", type=Path, default=SPEC, help="deployments file (default deploy/prefect.yaml)")
    sub.add_parser("show", help="list what is registered")
    c = sub.add_parser("crash-automation", help=f"create or update only the {CRASH_AUTOMATION} automation")
    c.add_argument("--heartbeat-s", type=int, default=HEARTBEAT_S, help="flow-run heartbeat period (>= 30)")
    c.add_argument("--crash-after-s", type=int, default=CRASH_AFTER_S, help="silence that marks a run Crashed")
    args = parser.parse_args(argv)
    if args.command == "show":
        show()
        return 0
    if args.command == "crash-automation":
        return apply_crash_automation(args.heartbeat_s, args.crash_after_s)
    if args.heartbeat_s < 30:
        parser.error("--heartbeat-s: Prefect sends flow-run heartbeats at most every 30 s")
    if args.gpus is not None and args.gpus < 1:
        parser.error("--gpus must be at least 1")
    try:
        apply(args.gpus, args.heartbeat_s, args.crash_after_s, args.spec)
    except SpecError as e:
        print(f"deployments: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
