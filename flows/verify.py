"""The verify flow: recheck every sample file of a run directory (`eagle3 verify` without a terminal)."""

from __future__ import annotations

from prefect import flow
from prefect.states import State

from tasks.failure import reports_failure
from tasks.progress import ENDS_PROGRESS
from tasks.verify import VerifySummary, verify_outcome, verify_task


@flow(name="verify", flow_run_name="verify {run_dir}", validate_parameters=True, **ENDS_PROGRESS)
@reports_failure
def verify_flow(run_dir: str, quick: bool = False, shards: tuple[int, ...] = ()) -> VerifySummary | State:
    """verify (every file, or headers only with `quick`) ─► Failed if bad samples were found (quarantined;
    the retry-failed flow redoes them)

    Args:
        run_dir: The run directory (store) to check, e.g. data/runs/demo; relative to the project directory.
        quick: Check headers, shapes and sizes only (seconds), not every value and checksum (reads every byte).
        shards: Shard ids to check, e.g. [0, 3]. Empty: every shard.
    """
    return verify_outcome(verify_task(run_dir, full=not quick, shards=list(shards) or None))
