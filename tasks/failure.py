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
import re
import sys
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
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
    "evaluate": "Read the evaluate task's log and `{key}-evaluation`; fix the cause the error names, then run the "
    "train deployment with stages [evaluate] on `{run_dir}`: the trained and exported draft is kept.",
    "run-config": "Give the run directory of an extraction that started (it has run.json), e.g. data/runs/demo.",
    "plan-retry": "Check `{run_dir}` with `eagle3 status {run_dir}`; retry-failed needs a store that extraction wrote.",
    "verify": "Run the retry-failed deployment with run_dir `{run_dir}` (or `eagle3 retry {run_dir}`): it redoes "
    "exactly the quarantined samples.",
    "launch-children": "Check that the child deployment exists and each node's worker pulls its work queue.",
    "watch-children": "Open the failed child flow runs (Subflow Runs) for their own `{key}-failure`.",
}


@dataclass(frozen=True)
class Cause:
    """A cause of failure that needs its own fix in whichever stage it shows: an error of one of `types` (class
    names), or one whose text (its own, its causes', a relayed worker's) matches `says`."""

    name: str
    says: re.Pattern[str] | None
    advice: str
    types: frozenset[str] = frozenset()

    def matches(self, kinds: set[str], text: str) -> bool:
        return bool(kinds & self.types) or (self.says is not None and self.says.search(text) is not None)


#: The device keys a stage reads, for the device advice (`{devices}`).
DEVICE_KEYS = {
    "train": "`train.device`",
    "evaluate": "`evaluate.device` and `server.device`",
    "extract": "`server.device`",
    "synthesize": "`server.device`",
    "prompts": "`server.device`",
}
#: The first cause that matches chooses the advice, before the error class's and the stage's.
CAUSES = (
    Cause(
        "device unavailable",
        re.compile(
            r"Torch not compiled with CUDA enabled|Found no NVIDIA driver|no CUDA GPUs are available|"
            r"no CUDA-capable device|CUDA driver version is insufficient|server\.device: cuda|"
            r"train\.device: cuda|evaluate\.device: cuda"
        ),
        "This worker has no usable CUDA device: set {devices} to `cpu`, or to `auto` (resolved on the worker the run "
        "lands on), or run the deployment on a work queue whose worker has GPUs.",
    ),
    Cause(
        "vocabulary mismatch",
        re.compile(r"train\.draft_vocab_size asks|vocab_map\.safetensors has \d+ draft ids"),
        "`{run_dir}/vocab_map.safetensors` was built for another draft vocabulary: set `train.draft_vocab_size` to "
        "the number of draft ids the map has (the error names it), or run convert again with this size (stages "
        "[convert, train, ...]), which rebuilds the map.",
    ),
    Cause(
        "missing layers",
        re.compile(r"the store holds aux layers|the store has aux layers"),
        "The draft reads layers the store does not hold (the error names them): set `train.aux_layers` to layers "
        "in `{run_dir}/run.json`'s aux_layers, or extract the missing ones into a new store (`extract.aux_layers` "
        "and a new `run_dir`).",
    ),
    Cause(
        "slowdown",
        None,
        "The draft makes serving slower (`{key}-evaluation` has both speeds): train longer or on more data, best the "
        "target's own answers (the synthesize stage); on a worker without a GPU the speed says nothing about serving "
        "on one: set `evaluate.fail_on_slowdown: false` there.",
        frozenset({"DraftSlowerError"}),
    ),
    Cause(
        "server start failure",
        re.compile(
            r"SGLang exited with code -?\d+ while starting|did not answer /health|server\.python \S+ does not "
            r"exist|stub libcuda|port \d+ is already in use"
        ),
        "The SGLang server did not start: read its log (the error names it and quotes its last lines); check "
        "`server.python` (deploy/sglang_env.sh builds it), `server.device` on this worker and a free `server.port`, "
        "or raise `server.startup_timeout_s` for a large model; then run again.",
    ),
    Cause(
        "disk",
        re.compile(r"No space left on device|Disk quota exceeded|not enough disk"),
        "The disk is full or over its budget (the error names the filesystem and the numbers): free space there, "
        "raise `disk.budget_gb` or lower `disk.reserve_fraction`, or give `run_dir` a larger filesystem; then run "
        "again: complete shards and checkpoints are kept.",
        frozenset({"DiskBudgetError"}),
    ),
)
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
    "OutputsChangedError": "Served with the draft, the target gave another greedy output than without it, beyond a "
    "near-tie (`{key}-evaluation` lists each prompt, position and top-2 gap): that is a serving bug (SGLang's EAGLE3 "
    "path, server_patch/), not a weak draft; keep `{run_dir}/eval/` and the server logs in it for the report.",
    "ExtractIncomplete": ADVICE["extract"],
    "FanoutIncomplete": ADVICE["extract"],
    "BadSamplesFound": ADVICE["verify"],
}
#: The stage behind an error that a flow builds from a Failed state instead of raising it in a task.
ERROR_STAGE = {
    "ExtractIncomplete": "extract",
    "FanoutIncomplete": "extract",
    "BadSamplesFound": "verify",
    "DraftSlowerError": "evaluate",
    "OutputsChangedError": "evaluate",
}
DEFAULT_ADVICE = (
    "Fix the cause the first error names, then run the same deployment again: finished stages and complete "
    "shards are skipped."
)


#: The run directory the flow run works on once it is known (merged over the deployment's config, its {date} and
#: {model_sha} filled in: tasks/flow_start.py), which the failure artifact is keyed by like every other artifact.
RUN_DIR: ContextVar[str | None] = ContextVar("eagle3_failure_run_dir", default=None)


def run_dir_is(run_dir: str) -> None:
    """The flow run works on `run_dir` (the filled-in one): its failure report is keyed by it."""
    RUN_DIR.set(run_dir)


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


def error_chain(error: BaseException | None) -> list[BaseException]:
    """The error and the errors it was raised from or during, outermost first."""
    chain: list[BaseException] = []
    while error is not None and error not in chain:
        chain.append(error)
        error = error.__cause__ or error.__context__
    return chain


def cause_of(error: BaseException | None, message: str | None = None) -> Cause | None:
    """The first of CAUSES that the error (with its causes) or the failure's message names."""
    chain = error_chain(error)
    kinds = {type(e).__name__ for e in chain}
    text = "\n".join([message or "", *(error_text(e) for e in chain)])
    return next((c for c in CAUSES if c.matches(kinds, text)), None)


def advice(stage: str | None, error: BaseException | None, run_dir: str, message: str | None = None) -> str:
    """The one thing to do: by the cause the error names (CAUSES), else by its class (ERROR_ADVICE), else by the
    stage that failed (ADVICE)."""
    kind = type(error).__name__ if error is not None else ""
    cause = cause_of(error, message)
    text = (cause.advice if cause else None) or ERROR_ADVICE.get(kind) or ADVICE.get(stage or "") or DEFAULT_ADVICE
    devices = DEVICE_KEYS.get(stage or "", "`train.device`, `server.device` and `evaluate.device`")
    return text.format(run_dir=run_dir, key=run_prefix(run_dir), devices=devices)


def error_text(error: BaseException) -> str:
    """`Type: message`; an error that relays another process's exception (`relays`, e.g. TrainFailedError: the
    torchrun worker's `TrainError: ...`) is that exception, and its further lines (torchrun's exit, the log's path)
    follow in parentheses."""
    if not getattr(error, "relays", False):
        return f"{type(error).__name__}: {error}"
    head, _, rest = str(error).partition("\n")
    return f"{head} ({rest})" if rest.strip() else head


def first_error(error: BaseException | None, message: str | None) -> str:
    text = message or (error_text(error) if error is not None else "failed")
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
    todo = advice(stage, error, run_dir, message)
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
        given = run_dir_of(fn, args, kwargs)  # until start_flow names the run directory (a subflow: its own)
        token = RUN_DIR.set(None)
        try:
            try:
                result = fn(*args, **kwargs)
            except Exception as e:
                return report_failure(RUN_DIR.get() or given, e)
            if isinstance(result, State) and result.is_failed():  # e.g. shards that did not complete
                data = result.data if isinstance(result.data, BaseException) else None
                return report_failure(RUN_DIR.get() or given, data, result.message)
            return result
        finally:
            RUN_DIR.reset(token)

    # Prefect reads the parameters (form, validation) from the signature: the flow's own, its annotations
    # resolved in the flow's module (a string annotation would be looked up in this module).
    flow_body.__signature__ = inspect.signature(fn, eval_str=True)  # type: ignore[attr-defined]
    return flow_body
