"""Which shards failed, and what a retry must redo.

    shard_summaries  one row per shard from the manifests (cheap; `eagle3 status`, the failed-shards table)
    failed_shards    the rows of shards that are failed or partial
    missing_samples  the prepared samples of a shard that have no sound file (header check)
    plan_retry       the shards a retry runs: failed, partial, killed while running, or complete on paper
                     but missing files; never-started shards only when named

The retry itself is extract_shard on each planned shard: it adopts every sound file and runs the engine
on exactly the missing samples, so a retry never redoes finished work.
"""

from __future__ import annotations

from dataclasses import dataclass

from eagle3.store.run_store import RunInfo, RunStore, ShardManifest


@dataclass(frozen=True)
class ShardSummary:
    shard: int
    status: str  # a ShardStatus; "pending" also when there is no manifest yet
    expected: int  # samples in the prepared shard
    done: int  # samples the manifest lists as written
    failed: int  # samples with a recorded error
    first_error: str | None  # "<sample id>: <reason>", or the shard's abort reason
    log: str | None  # the manifest's log field (abort reason or where the log is)
    manifest: str  # path of the manifest (where to look)

    @property
    def missing(self) -> int:
        return max(0, self.expected - self.done)

    def row(self) -> dict[str, object]:
        """One row of the failed-shards / status table."""
        return {
            "shard": self.shard,
            "status": self.status,
            "done": f"{self.done}/{self.expected}",
            "failed samples": self.failed,
            "first error": self.first_error or "",
            "log": self.log or self.manifest,
        }


def summarize(store: RunStore, m: ShardManifest, has_manifest: bool) -> ShardSummary:
    first = next(iter(m.errors.items()), None)
    first_error = f"{first[0]}: {first[1]}" if first else m.log
    return ShardSummary(
        shard=m.shard,
        status=m.status,
        expected=m.expected,
        done=len(m.samples),
        failed=len(m.errors),
        first_error=first_error,
        log=m.log,
        manifest=str(store.manifest_path(m.shard)) if has_manifest else "(no manifest: not started)",
    )


def shard_summaries(store: RunStore) -> list[ShardSummary]:
    """Every shard of the run, from its manifest (no sample file is read)."""
    out = []
    for m in store.manifests():
        out.append(summarize(store, m, store.manifest_path(m.shard).exists()))
    return out


def failed_shards(store: RunStore) -> list[ShardSummary]:
    """Shards whose manifest says failed or partial (what the failed-shards artifact lists)."""
    return [s for s in shard_summaries(store) if s.status in ("failed", "partial")]


def missing_samples(store: RunStore, shard: int, info: RunInfo | None = None) -> list[str]:
    """Prepared samples of `shard` without a sound file, in prepared order. With run.json (`info`) a file
    counts only if its header matches the run; without it, existence is enough."""
    out = []
    for s in store.prepared_samples(shard):
        if info is not None:
            if store.existing_ok(shard, s, info) is None:
                out.append(s.sample_id)
        elif not store.sample_path(shard, s.sample_id).exists():
            out.append(s.sample_id)
    return out


def plan_retry_samples(store: RunStore, shards: list[int] | None = None) -> dict[int, list[str]]:
    """shard -> the sample ids a retry must redo, for every shard that needs a retry.

    Without `shards`: shards whose manifest is failed, partial or running (a killed run), plus complete ones
    whose files went missing. Shards never started are left to the original flow. With `shards`: exactly
    those (never-started ones included), each only if something is missing."""
    n = store.num_shards()
    if shards is not None:
        unknown = [s for s in shards if not 0 <= s < n]
        if unknown:
            raise ValueError(f"shards {unknown} do not exist; {store.root} has shards 0..{n - 1}")
    info = store.read_run_info()
    plan: dict[int, list[str]] = {}
    for s in sorted(set(shards)) if shards is not None else range(n):
        m = store.read_manifest(s)
        if shards is None and m is None:
            continue
        missing = missing_samples(store, s, info)
        if missing or (m is not None and m.status != "complete"):  # a re-run also corrects a stale status
            plan[s] = missing
    return plan


def plan_retry(store: RunStore, shards: list[int] | None = None) -> list[int]:
    """The shards a retry runs (see plan_retry_samples), in order."""
    return sorted(plan_retry_samples(store, shards))
