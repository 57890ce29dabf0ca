"""Progress with an ETA as Prefect artifacts: one per task (updated in place) and one per stage of a run,
with the same line in the task's log; `RunProgressBoard` feeds one run-level artifact from shard tasks running at
once. Artifact writes are API calls: progress is throttled to one write every
`min_interval_s` (2 s), and a failed write is logged once and never fails the task that reports.

A flow run that ends Crashed or Cancelled leaves no live-looking progress: every flow has `ENDS_PROGRESS` as its
on_crashed and on_cancellation hooks, which rewrite its unfinished progress artifacts to say how it ended (last
figures, no ETA) and end its task runs still Running the same way.
"""

from __future__ import annotations

import contextvars
import logging
import re
import threading
import time
from pathlib import Path
from typing import Any, cast
from uuid import UUID

from prefect.artifacts import (
    create_progress_artifact,
    update_progress_artifact,
)
from prefect.client.schemas.objects import FlowRun, State
from pydantic import BaseModel

from eagle3.progress import Progress
from tasks.artifacts import run_key

BAR_WIDTH = 24
HEARTBEAT_S = 20.0  # a step silent this long still shows it is working (at least every 30 s, docs/gpu-node.md)


def format_eta(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = max(0, round(seconds))
    if seconds < 120:
        return f"{seconds}s"
    minutes, s = divmod(seconds, 60)
    if minutes < 120:
        return f"{minutes}m{s:02d}s"
    h, m = divmod(minutes, 60)
    return f"{h}h{m:02d}m"


def describe(done: int, total: int, unit: str, tokens_per_s: float | None, eta_s: float | None, extra: str = "") -> str:
    """The one-line progress text: `N/M samples, X tok/s, ETA Ys`; without the rate where the work is not tokens
    (`tokens_per_s` None: `1/1 drafts, ETA 0s`)."""
    rate = f", {tokens_per_s:.0f} tok/s" if tokens_per_s is not None else ""
    text = f"{done}/{total} {unit}{rate}, ETA {format_eta(eta_s)}"
    return f"{text}, {extra}" if extra else text


def text_bar(fraction: float) -> str:
    filled = min(BAR_WIDTH, max(0, round(fraction * BAR_WIDTH)))
    return "[" + "#" * filled + "-" * (BAR_WIDTH - filled) + f"] {100 * fraction:5.1f}%"


class ProgressArtifact:
    """One Prefect progress artifact (0-100), created on first use and then updated in place."""

    def __init__(
        self,
        logger: logging.Logger | logging.LoggerAdapter[Any],
        *,
        key: str | None = None,
        artifact_id: UUID | str | None = None,
        min_interval_s: float = 2.0,
    ):
        self.logger = logger
        self.key = key
        self.artifact_id: UUID | None = UUID(str(artifact_id)) if artifact_id else None
        self.min_interval_s = min_interval_s
        self._last = float("-inf")
        self._broken = False

    def create(self, percent: float, description: str) -> UUID | None:
        """Create the artifact now (if not yet created) and return its id."""
        if self.artifact_id is None:
            self._write(percent, description)
        return self.artifact_id

    def update(self, percent: float, description: str, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self.min_interval_s:
            return
        self._last = now
        self._write(percent, description)

    def _write(self, percent: float, description: str) -> None:
        if self._broken:
            return
        percent = min(100.0, max(0.0, percent))
        try:
            if self.artifact_id is None:
                self.artifact_id = cast(UUID, create_progress_artifact(percent, key=self.key, description=description))
            else:
                update_progress_artifact(self.artifact_id, percent, description=description)
        except Exception as e:  # progress is a view; the work must go on without it
            self._broken = True
            self.logger.warning("progress artifact %s: write failed (%s); no further updates", self.key, e)


class RunProgressRef(BaseModel):
    """Where a shard task reports its share of a run-level progress artifact (small, serialisable)."""

    artifact_id: str
    total: int  # samples over all shards of this flow run


class TaskProgress:
    """A ProgressFn for a task: feeds the task's progress artifact and writes a log line with a text bar every
    `log_every_s` (the terminal's progress bar: Prefect prints run logs to the console, and the same lines show in
    the UI).

    Used as a context manager around the library call, it also creates the artifact at once and keeps the
    step visibly alive: when the library reports nothing for `heartbeat_s` (loading a model, a first compiled
    step, one long sample), a background thread writes the last figures with the time since the start, to the
    artifact and the log, so every long step shows progress within its first minute and then at least every
    `heartbeat_s`. `tokens=False`: the work is not measured in tokens (export's drafts): no tok/s in the text."""

    def __init__(
        self,
        logger: logging.Logger | logging.LoggerAdapter[Any],
        label: str,
        *,
        key: str | None = None,
        unit: str = "samples",
        min_interval_s: float = 2.0,
        log_every_s: float = 10.0,
        heartbeat_s: float = HEARTBEAT_S,
        tokens: bool = True,
    ):
        self.logger = logger
        self.label = label
        self.unit = unit
        self.tokens = tokens
        self.own = ProgressArtifact(logger, key=key, min_interval_s=min_interval_s)
        self.log_every_s = log_every_s
        self._last_log = time.monotonic()
        self._final_logged: tuple[int, int, int] | None = None
        self._stage: str | None = None
        self.last: Progress | None = None
        self.heartbeat_s = heartbeat_s
        self._started = self._last_report = time.monotonic()
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def start(self) -> None:
        """Create the artifact now, at 0%: the step started."""
        self.own.create(0.0, f"{self.label}: started")

    def __enter__(self) -> TaskProgress:
        self.start()
        # The beat runs in the task's context (settings, run logger), copied into its thread.
        context = contextvars.copy_context()
        self._beat = threading.Thread(target=context.run, args=(self._heartbeat,), daemon=True, name="progress-beat")
        self._beat.start()
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=10)
        if isinstance(exc, Exception):  # the artifact must not stay at `started` or at its last figures
            self.fail(exc)

    def fail(self, error: BaseException) -> None:
        """The artifact and the log say the step Failed, with its last figures and the error's first line."""
        p = self.last
        figures = self.describe(p, None) if p else "no figures yet"
        reason = (str(error).strip().splitlines() or [""])[0][:200]
        text = (
            f"Failed after {format_eta(time.monotonic() - self._started)}: {type(error).__name__}: {reason} ({figures})"
        )
        self.own.update(100 * p.fraction if p else 0.0, text, force=True)
        self.logger.error("%s %s", self.label, text)

    def _heartbeat(self) -> None:
        while not self._stop.wait(min(self.heartbeat_s, 1.0)):
            if time.monotonic() - self._last_report >= self.heartbeat_s:
                self.still_working()

    def still_working(self) -> None:
        """The last figures (or `started`) with the time since the start: the step is alive, not stuck."""
        now = time.monotonic()
        self._last_report = now
        p = self.last
        figures = self.describe(p, p.eta_s) if p else "no figures yet"
        text = f"{figures}; working for {format_eta(now - self._started)}"
        self.own.update(100 * p.fraction if p else 0.0, text, force=True)
        self.logger.info("%s %s %s", self.label, text_bar(p.fraction if p else 0.0), text)

    def describe(self, p: Progress, eta_s: float | None, extra: str = "") -> str:
        return describe(p.done, p.total, self.unit, p.tokens_per_s if self.tokens else None, eta_s, extra)

    def __call__(self, p: Progress) -> None:
        self._last_report = time.monotonic()
        self.last = p
        self._stage = self._stage or p.stage
        final = p.total > 0 and p.done >= p.total
        extra = ", ".join(f"{n} {k}" for k, n in (("skipped", p.skipped), ("failed", p.failed)) if n)
        if p.stage != self._stage:  # a second phase of the same call (e.g. synthesize, then tokenize)
            extra = ", ".join(x for x in (p.stage, extra) if x)
        self.own.update(100 * p.fraction, self.describe(p, p.eta_s, extra), force=final)
        now = time.monotonic()
        if final and (p.done, p.skipped, p.failed) == self._final_logged:
            return  # the library reports its end twice (last add + finish): log it once
        if final or now - self._last_log >= self.log_every_s:
            if final:
                self._final_logged = (p.done, p.skipped, p.failed)
            self._last_log = now
            text = self.describe(p, p.eta_s, extra)
            self.logger.info("%s %s %s", self.label, text_bar(p.fraction), text)


# run progress over shards that run at once (an extract flow run's board) -----------------------------------
class RunProgressBoard:
    """The run-level progress artifact of one flow run, fed by all its shard tasks at once (one board per flow run:
    its FlowContext's `board()`): done = the sum over shards, rate = samples worked here per second since the first
    report."""

    def __init__(self, ref: RunProgressRef, logger: Any):
        self.ref = ref
        self.artifact = ProgressArtifact(logger, artifact_id=ref.artifact_id)
        self.shards: dict[int, Progress] = {}
        self.start = time.monotonic()
        self._lock_self = threading.Lock()

    def report(self, shard: int, p: Progress) -> None:
        with self._lock_self:
            self.shards[shard] = p
            done = sum(x.done for x in self.shards.values())
            worked = sum(x.done - x.skipped for x in self.shards.values())
            tokens = sum(x.tokens for x in self.shards.values())
            eta_tokens = self.tokens_left(tokens)
        elapsed = max(1e-9, time.monotonic() - self.start)
        rate = worked / elapsed if worked > 0 else 0.0
        if eta_tokens is not None and tokens > 0:  # the work is prefill tokens: one long sample moves it by its length
            eta: float | None = eta_tokens * elapsed / tokens
        else:
            eta = (self.ref.total - done) / rate if rate > 0 else None
        final = done >= self.ref.total
        fraction = done / self.ref.total if self.ref.total else 1.0
        text = describe(done, self.ref.total, "samples", tokens / elapsed, eta)
        self.artifact.update(100 * fraction, text, force=final)

    def tokens_left(self, tokens: int) -> int | None:
        """Tokens still to extract: the shards that reported know theirs; the others are estimated at the same
        tokens per sample. None before any shard reported its tokens."""
        units = sum(x.total for x in self.shards.values())
        known = sum(x.total_tokens for x in self.shards.values())
        if units <= 0 or known <= 0:
            return None
        total = known * self.ref.total / units
        settled = sum(x.settled_tokens for x in self.shards.values())
        return max(0, round(total - settled - tokens))


def create_run_progress(run_dir: str | Path, stage: str, total: int) -> RunProgressRef:
    """The run-level progress artifact of a stage (keyed per run directory), at 0%."""
    artifact_id = create_progress_artifact(
        0.0, key=run_key(run_dir, f"{stage}-progress"), description=describe(0, total, "samples", 0.0, None)
    )
    return RunProgressRef(artifact_id=str(artifact_id), total=total)


def finish_run_progress(ref: RunProgressRef, done: int, description: str) -> None:
    percent = 100.0 * done / ref.total if ref.total else 100.0
    update_progress_artifact(UUID(ref.artifact_id), percent, description=description)


# a flow run that ended before its work did -----------------------------------------------------------------------
LIVE_PARTS = re.compile(r",? ETA [^,;]*|; working for [^,;]*")


def ended_text(description: str | None, state_name: str) -> str:
    """A progress line as it stands when its flow run ended `state_name`: the last figures, without the ETA."""
    figures = LIVE_PARTS.sub("", description or "").strip(" ,;") or "no figures yet"
    return f"{state_name}: the flow run ended at {figures}; nothing runs any more"


def end_progress(flow_run_id: UUID, state: State) -> int:
    """The flow run's progress artifacts below 100% that still read as live now say it ended (`Crashed: the flow
    run ended at 50/200 samples, 236 tok/s; ...`), and its task runs still Running take the run's final state.
    Returns how many artifacts changed."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        ArtifactFilterType,
        FlowRunFilter,
        FlowRunFilterId,
        TaskRunFilter,
        TaskRunFilterState,
        TaskRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.states import Cancelled, Crashed

    cancelled = state.is_cancelled() or state.is_cancelling()
    name = "Cancelled" if cancelled else state.name or "Crashed"
    changed = 0
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(
                flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]), type=ArtifactFilterType(any_=["progress"])
            )
        )
        for a in artifacts:
            text = a.description or ""
            if float(cast(float, a.data or 0.0)) >= 100.0 or text.startswith(("Failed", f"{name}:")):
                continue  # finished, or already says why it stopped
            update_progress_artifact(a.id, float(cast(float, a.data or 0.0)), description=ended_text(text, name))
            changed += 1
        running = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])),
            task_run_filter=TaskRunFilter(
                state=TaskRunFilterState(type=TaskRunFilterStateType(any_=[StateType.RUNNING]))
            ),
        )
        for tr in running:
            message = f"the flow run ended {name}"
            final: State[Any] = Cancelled(message=message) if cancelled else Crashed(message=message)
            client.set_task_run_state(tr.id, final, force=True)
    return changed


def progress_ends_with_run(flow: Any, flow_run: FlowRun, state: State) -> None:
    """The on_crashed / on_cancellation hook of every flow: end_progress; never raises (a hook that fails is only
    logged by Prefect, and the run's state is already final)."""
    try:
        end_progress(flow_run.id, state)
    except Exception as e:
        logging.getLogger(__name__).warning("progress of flow run %s: not marked %s (%s)", flow_run.id, state.name, e)


def end_stale_progress(run_dir: str | Path) -> list[UUID]:
    """The progress of this run directory's stages that a flow run left live-looking when it ended without running
    its hooks (its node lost; the crash automation marked it Crashed), ended as that run did (end_progress). Called
    as the next flow run on the run directory starts; returns the flow runs it ended."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    from tasks.artifacts import STAGE_ARTIFACTS

    keys = sorted({run_key(run_dir, k) for ks in STAGE_ARTIFACTS.values() for k in ks if k.endswith("-progress")})
    ended: list[UUID] = []
    with get_client(sync_client=True) as client:
        for key in keys:
            latest = client.read_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])),
                sort=ArtifactSort.CREATED_DESC,
                limit=1,
            )
            if not latest or latest[0].flow_run_id is None or latest[0].flow_run_id in ended:
                continue
            run_id = latest[0].flow_run_id
            done = float(cast(float, latest[0].data or 0.0)) >= 100.0
            if done or (latest[0].description or "").startswith(("Failed", "Crashed:", "Cancelled:")):
                continue
            state = client.read_flow_run(run_id).state
            if state is not None and (state.is_crashed() or state.is_cancelled()):
                end_progress(run_id, state)
                ended.append(run_id)
    return ended


#: `@flow(..., **ENDS_PROGRESS)`: a Crashed or Cancelled run's progress says so (progress_ends_with_run).
ENDS_PROGRESS: dict[str, Any] = {"on_crashed": [progress_ends_with_run], "on_cancellation": [progress_ends_with_run]}
