"""What the extract tasks hand each other: the flow run's plan, one shard's result, the run's summary.
Small, serialisable (JSON results, no pickle)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from tasks.progress import RunProgressRef

#: complete: extracted here. skipped: already complete when looked at. leased: another live run holds the
#: shard's lease (the flow waits for it afterwards). by-other-run: completed by another run while waiting.
ShardOutcome = Literal["complete", "skipped", "leased", "by-other-run"]


class ExtractPlan(BaseModel):
    """What the shard tasks need to know about this flow run."""

    run_dir: str
    shards: list[int]
    expected: dict[int, int]  # shard -> prepared samples
    progress: RunProgressRef


class ShardResult(BaseModel):
    shard: int
    status: ShardOutcome
    samples: int
    tokens: int
    bytes: int
    seconds: float
    server: str = ""  # the server that extracted it here
    holder: str = ""  # leased / by-other-run: who held the lease


class ShardIncomplete(RuntimeError):
    """Some samples of a shard failed; retrying the task redoes only those."""


class ShardStillLeased(RuntimeError):
    """Another run held a shard's lease for longer than this flow run waits."""


class ExtractIncomplete(RuntimeError):
    """Some shards did not complete; raised in the caller of the extract flow (e.g. the pipeline)."""


class ExtractSummary(BaseModel):
    run_dir: str
    shards: list[int]
    complete: list[int]
    failed: dict[int, str]  # shard -> reason
    samples: int
    expected: int
    tokens: int
    bytes: int
    extracted: list[int] = []  # by this flow run (the rest were complete already, or done by another run)
    by_other_runs: list[int] = []
    servers: dict[str, list[int]] = {}  # server label -> shards it extracted in this flow run


def select_shards(wanted: list[int] | None, num_shards: int) -> list[int]:
    if wanted is None:
        return list(range(num_shards))
    missing = [s for s in wanted if not 0 <= s < num_shards]
    if missing:
        raise ValueError(f"extract.shards {wanted}: {missing} do not exist; the run has shards 0..{num_shards - 1}")
    return sorted(set(wanted))
