"""verify: recheck every sample file of a run directory, around `eagle3.store.verify.verify_run`."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.states import Failed, State
from pydantic import BaseModel

from eagle3.store.run_store import RunStore
from eagle3.store.verify import verify_run
from tasks.artifacts import run_key, table_artifact
from tasks.progress import TaskProgress

#: A full check reads every byte: about 1 TB at disk read speed (~1 GB/s) is under 20 minutes; headers
#: only (quick) is seconds. Generous, because a slow network filesystem is the common case.
VERIFY_TIMEOUT_S = 12 * 3600


class VerifySummary(BaseModel):
    run_dir: str
    full: bool
    sound: int
    bad: dict[int, list[str]]  # shard -> quarantined or missing sample ids, to redo
    not_extracted: int
    text: str

    @property
    def bad_count(self) -> int:
        return sum(len(v) for v in self.bad.values())


class BadSamplesFound(RuntimeError):
    """verify found samples that were counted as done but are not sound (they were quarantined)."""


@task(name="verify", retries=0, timeout_seconds=VERIFY_TIMEOUT_S, cache_policy=NO_CACHE)
def verify_task(run_dir: str, full: bool = True, shards: list[int] | None = None) -> VerifySummary:
    """Recheck `shards` (None: all); bad files go to <run_dir>/quarantine and the manifests say what to redo.
    Takes the run lock, so it refuses while a run writes the store. Table artifact: one row per shard."""
    logger = get_run_logger()
    progress = TaskProgress(logger, "verify", key=run_key(run_dir, "verify-progress"))
    with progress:
        report = verify_run(RunStore(run_dir), full=full, shards=shards, report=progress)
    table_artifact(run_key(run_dir, "verify"), [s.row() for s in report.shards], report.summary())
    (logger.error if report.bad_count else logger.info)("%s", report.summary())
    return VerifySummary(
        run_dir=report.run_dir,
        full=full,
        sound=report.ok_count,
        bad={s.shard: sorted(s.bad) for s in report.shards if s.bad},
        not_extracted=report.missing_count,
        text=report.summary(),
    )


def verify_outcome(summary: VerifySummary) -> VerifySummary | State:
    """The flow's result: the summary, or Failed when bad samples were found (and quarantined)."""
    if summary.bad_count == 0:
        return summary
    return Failed(message=summary.text, data=BadSamplesFound(summary.text))
