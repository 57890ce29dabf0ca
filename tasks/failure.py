"""Why a flow run failed, where a user looks first: the flow run's state message and a short `<run>-failure`
markdown artifact (what failed, the first error, the one thing to do), for every flow and every stage.

Every flow is wrapped with `reports_failure` (under `@flow`): an exception out of the flow body, or a Failed
state the flow returns (a shard that did not complete, bad samples found, a draft that slows serving), becomes
one Failed state whose message leads with the stage and the first error, and one artifact. The failing stage
is the first failed task run of the flow run (Prefect's own record), so the report needs nothing from the
tasks themselves. Writing the report never hides the failure: a broken API only loses the artifact.
"""

from __future__ import annotations

import functools
import inspect
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from prefect import get_run_logger
from prefect.context import FlowRunContext
from prefect.states import Failed, State

from tasks.artifacts import markdown_artifact, run_key, run_prefix

P = ParamSpec("P")
R = TypeVar("R")
FIRST_ERROR_CHARS = 2000

#: The one thing to do when a stage fails, by the task (or subflow) that failed. `{run_dir}` is filled in.
ADVICE = {
    "model": "Check `model`: a Hugging Face model directory with config.json and a tokenizer, or `demo`.",
    "preflight": "The run's settings do not fit the store in `{run_dir}` (the error names the keys): set them "
    "back to the values in `{run_dir}/run.json`, or give the run a new `run_dir`.",
    "prepare": "Fix what the first error names (the file, row or key), then run again: prepare redoes only what "
    "changed.",
    "synthesize": "Fix the cause the error names, then run again: finished generations are kept and only the "
    "rest is generated.",
    "open-run": "The store in `{run_dir}` was made with other data or settings: give this run a new `run_dir`, "
    "or run with the settings recorded in `{run_dir}/run.json`.",
    "disk-budget": "Free disk space or lower `disk.reserve_fraction` / raise `disk.budget_gb`, then run again: "
    "complete shards are skipped.",
    "extract": "Open `{key}-extract-failed-shards` for each shard's first error; fix the cause, then run the "
    "retry-failed deployment with run_dir `{run_dir}` (or `eagle3 retry {run_dir}`): only missing samples are redone.",
    "convert": "Run the verify deployment (or `eagle3 verify {run_dir}`) to find bad sample files, then "
    "retry-failed to redo them, then convert again.",
    "train": "Read the trainer's own log, `{run_dir}/train/train.log`; fix the cause and run train again: it "
    "resumes from the last checkpoint.",
    "export": "Check that `{run_dir}/train/checkpoints` holds a checkpoint (run train first), then export again.",
    "evaluate": "Read `{key}-evaluation`; a draft slower than the plain server needs more or better training "
    "data, or set `evaluate.fail_on_slowdown: false` where speed is not the point.",
    "run-config": "Give the run directory of an extraction that started (it has run.json), e.g. data/runs/demo.",
    "plan-retry": "Check `{run_dir}` with `eagle3 status {run_dir}`; retry-failed needs a store that extraction wrote.",
    "verify": "Run the retry-failed deployment with run_dir `{run_dir}` (or `eagle3 retry {run_dir}`): it redoes "
    "exactly the quarantined samples.",
    "launch-children": "Check that the child deployment exists and each node's worker pulls its work queue.",
    "watch-children": "Open the failed child flow runs (Subflow Runs) for their own `{key}-failure`.",
}
#: By exception class name, before the stage's advice: the flow's own failures before or between tasks, and the
#: causes within a stage that need another fix than the stage's usual one.
ERROR_ADVICE = {
    "DatasetUnreadableError": "Check `data.dataset` (or `data.sources`): an existing .jsonl/.parquet file, a folder "
    "or glob of them (relative to the project directory), or a Hugging Face dataset this node can reach; then run "
    "again.",
    "BadRowError": "Fix or drop the row the error names, or set `data.on_bad_row: skip` to skip bad rows (they are "
    "listed in prepared/manifest.json); then run again: prepare redoes only what changed.",
    "StoreMismatchError": "`{run_dir}` holds samples prepared from other data or settings: give this run a new "
    "`run_dir` (it may hold {{date}} or {{model_sha}}), or run with the data settings it was prepared with "
    "(`{run_dir}/prepared/manifest.json`).",
    "NoStoreError": "`{run_dir}` holds no store: give `run_dir` the directory a pipeline run wrote (it has "
    "run.json and prepared/; the first error names the stores nearby). There is nothing here to verify or retry.",
    "NothingExtractedError": "`{run_dir}` was prepared but never extracted: run the extract deployment (or the "
    "pipeline with the extract stage) on it first; verify and retry-failed work on extracted samples.",
    "RunLockedError": "Another run holds `{run_dir}` (the error names it): wait for it to finish, or cancel it, "
    "or give this run another `run_dir`.",
    "RunLockLostError": "Another run took over `{run_dir}`: let it finish, then run again.",
    "ServingRefusedError": "SGLang cannot serve this target's EAGLE-3 draft from what the pipeline stores (the error "
    "says why, read in SGLang's source: docs/models.md). Run only stages that do not need SGLang (no export, "
    "`server.engine: transformers`, `evaluate.live: off`), give `extract.sglang_layer_ids` where the error says no "
    "rule is known, or train a draft for another model.",
    "ExtractIncomplete": ADVICE["extract"],
    "FanoutIncomplete": ADVICE["extract"],
    "BadSamplesFound": ADVICE["verify"],
}
#: The stage behind an error that a flow builds from a Failed state instead of raising it in a task.
ERROR_STAGE = {"ExtractIncomplete": "extract", "FanoutIncomplete": "extract", "BadSamplesFound": "verify"}
DEFAULT_ADVICE = (
    "Fix the cause the first error names, then run the same deployment again: finished stages and complete "
    "shards are skipped."
)


def run_dir_of(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """The run directory a flow call works on: its `config.run_dir` or its `run_dir` parameter."""
    bound = inspect.signature(fn).bind_partial(*args, **kwargs).arguments
    config = bound.get("config")
    return str(getattr(config, "run_dir", None) or bound.get("run_dir") or "run")


def failed_task(error: BaseException | None) -> str | None:
    """The name of the innermost Prefect task the error went through (`prepare`, `extract-shard`), read from its
    traceback: a frame of a module in tasks/ running a function that module exposes as a task. None when the
    error came from the flow body or was never raised (a Failed state a subflow returned)."""
    from prefect import Task

    name = None
    tb = error.__traceback__ if error is not None else None
    while tb is not None:
        module = sys.modules.get(str(tb.tb_frame.f_globals.get("__name__", "")))
        if module is not None and module.__name__.startswith("tasks."):
            candidate = getattr(module, tb.tb_frame.f_code.co_name, None)
            if isinstance(candidate, Task):
                name = candidate.name
        tb = tb.tb_next
    return name


def stage_of(task_run_name: str) -> str:
    """The ADVICE key a task run belongs to: `extract-shard-00003` -> `extract`, `prepare-3f2` -> `prepare`."""
    for key in sorted(ADVICE, key=len, reverse=True):
        if task_run_name == key or task_run_name.startswith(key + "-"):
            return key
    return task_run_name


def advice(stage: str | None, error: BaseException | None, run_dir: str) -> str:
    kind = type(error).__name__ if error is not None else ""
    text = ERROR_ADVICE.get(kind) or ADVICE.get(stage or "") or DEFAULT_ADVICE
    return text.format(run_dir=run_dir, key=run_prefix(run_dir))


def first_error(error: BaseException | None, message: str | None) -> str:
    text = message or (f"{type(error).__name__}: {error}" if error is not None else "failed")
    text = " ".join(text.split())
    return text if len(text) <= FIRST_ERROR_CHARS else text[: FIRST_ERROR_CHARS - 3] + "..."


def failure_markdown(flow_name: str, run_dir: str, what: str, error: str, todo: str) -> str:
    return "\n".join(
        [
            f"# {flow_name} failed: `{Path(run_dir).resolve()}`",
            "",
            f"**What failed:** {what}",
            "",
            f"**First error:** {error}",
            "",
            f"**What to do:** {todo}",
            "",
            "The task's own log (Logs tab, or the task run's page) has the traceback.",
        ]
    )


def report_failure(run_dir: str, error: BaseException | None, message: str | None = None) -> State:
    """The flow run's Failed state (message: stage, first error, what to do) and its `<run>-failure` artifact."""
    logger: logging.Logger | logging.LoggerAdapter[Any] = get_run_logger()
    ctx = FlowRunContext.get()
    flow_name = ctx.flow.name if ctx and ctx.flow else "flow"
    task_name = failed_task(error)
    kind = type(error).__name__ if error is not None else ""
    stage = stage_of(task_name) if task_name else ERROR_STAGE.get(kind)
    run_name = ctx.flow_run.name if ctx and ctx.flow_run else flow_name
    if task_name:
        what = f"the `{task_name}` task (stage `{stage}`) of flow run `{run_name}`"
    elif stage:
        what = f"stage `{stage}` of the `{flow_name}` flow"
    else:
        what = f"the `{flow_name}` flow itself, before or between its tasks"
    error_text = first_error(error, message)
    todo = advice(stage, error, run_dir)
    try:
        markdown_artifact(
            run_key(run_dir, "failure"),
            failure_markdown(flow_name, run_dir, what, error_text, todo),
            f"Why {flow_name} failed on {run_dir}",
        )
    except Exception as e:  # the state below still carries the reason
        logger.warning("failure artifact for %s: write failed (%s)", run_dir, e)
    summary = f"{stage or flow_name} failed: {error_text.rstrip('.')}. What to do: {todo}"
    logger.error("%s", summary)
    return Failed(message=summary, data=error if error is not None else RuntimeError(summary))


def reports_failure(fn: Callable[P, R]) -> Callable[P, R | State]:
    """Decorate a flow function (under `@flow`): failures leave the reason in the state message and the
    `<run>-failure` artifact. Completed runs are untouched."""

    @functools.wraps(fn)
    def flow_body(*args: P.args, **kwargs: P.kwargs) -> R | State:
        run_dir = run_dir_of(fn, args, kwargs)
        try:
            result = fn(*args, **kwargs)
        except Exception as e:
            return report_failure(run_dir, e)
        if isinstance(result, State) and result.is_failed():  # e.g. shards that did not complete
            data = result.data if isinstance(result.data, BaseException) else None
            return report_failure(run_dir, data, result.message)
        return result

    # Prefect reads the parameters (form, validation) from the signature: the flow's own, its annotations
    # resolved in the flow's module (a string annotation would be looked up in this module).
    flow_body.__signature__ = inspect.signature(fn, eval_str=True)  # type: ignore[attr-defined]
    return flow_body
