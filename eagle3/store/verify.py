"""`eagle3 verify RUN_DIR`: recheck every sample file against the prepared data and the shard manifests.

For each prepared sample of each shard, a file that exists is checked: header, keys, shapes, dtypes, token
count against the prepared sample, and with `full=True` also token ids, loss mask, finite values, the
sample id it was written for, and the checksum the manifest recorded. Then:

    bad file                 moved to <run_dir>/quarantine/shard-NNNNN/ (nothing is deleted), dropped from
                             the manifest, its reason recorded in manifest.errors; the shard becomes partial
    listed but missing       dropped from the manifest, recorded as an error; the shard becomes partial
    sound but not listed     adopted into the manifest (written after the last manifest update)
    file of no sample here   moved to quarantine (an orphan, e.g. left by an earlier prepare)
    leftover temp file       removed (only a killed writer leaves one; verify holds the run lock)

so the next extract (or `eagle3 retry RUN_DIR`) redoes exactly the samples that are not sound.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open

from eagle3.progress import ProgressCounter, ProgressFn, no_progress
from eagle3.store.fsio import fsync_dir, remove_stale_temps
from eagle3.store.lock import RunLock
from eagle3.store.nearby import NoStoreError, require_store
from eagle3.store.paths import QUARANTINE_DIR, SAMPLE_SUFFIX, RunPaths
from eagle3.store.run_store import PreparedSample, RunInfo, RunStore, SampleEntry, ShardManifest, ShardStatus
from eagle3.store.sample_format import SampleFormatError, check_header, record_of, verify_sample

QUARANTINE = QUARANTINE_DIR  # <run_dir>/quarantine


class VerifyError(ValueError):
    """The run directory cannot be verified at all (no prepared data, no run.json)."""


@dataclass
class ShardVerify:
    """What verification found in one shard."""

    shard: int
    expected: int
    status_before: ShardStatus | None = None  # None: no manifest
    status_after: ShardStatus | None = None
    ok: int = 0  # sound files (listed or adopted)
    bad: dict[str, str] = field(default_factory=dict)  # sample id -> reason; quarantined or missing, to redo
    adopted: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # no file and not listed (never written, or failed before)
    orphans: list[str] = field(default_factory=list)  # file names that belong to no prepared sample of the shard
    quarantined: list[str] = field(default_factory=list)  # paths under <run_dir>/quarantine
    temps_removed: int = 0

    def row(self) -> dict[str, object]:
        first = next(iter(self.bad.items()), None)
        return {
            "shard": self.shard,
            "status": f"{self.status_before or '-'} -> {self.status_after or '-'}",
            "ok": self.ok,
            "bad": len(self.bad),
            "adopted": len(self.adopted),
            "missing": len(self.missing),
            "orphans": len(self.orphans),
            "first problem": f"{first[0]}: {first[1]}" if first else "",
        }


@dataclass
class VerifyReport:
    run_dir: str
    full: bool
    shards: list[ShardVerify]

    @property
    def bad_count(self) -> int:
        """Samples that were counted as done but are not sound (the CLI exits non-zero when > 0)."""
        return sum(len(s.bad) for s in self.shards)

    @property
    def ok_count(self) -> int:
        return sum(s.ok for s in self.shards)

    @property
    def missing_count(self) -> int:
        return sum(len(s.missing) for s in self.shards)

    @property
    def clean(self) -> bool:
        return self.bad_count == 0

    def bad_samples(self) -> list[tuple[int, str, str]]:
        """(shard, sample id, reason) of every bad sample, in shard order."""
        return [(s.shard, sid, why) for s in self.shards for sid, why in sorted(s.bad.items())]

    def summary(self, show: int = 5) -> str:
        """One paragraph: the counts, the first `show` bad sample ids, and how to redo them."""
        adopted = sum(len(s.adopted) for s in self.shards)
        orphans = sum(len(s.orphans) for s in self.shards)
        text = (
            f"verified {self.run_dir} ({'full' if self.full else 'headers only'}): "
            f"{self.ok_count} sound, {self.bad_count} bad, {adopted} adopted, {self.missing_count} not extracted, "
            f"{count(orphans, 'orphan file')}"
        )
        bad = self.bad_samples()
        if bad:
            ids = ", ".join(f"{sid} (shard {shard})" for shard, sid, _ in bad[:show])
            text += f"; bad: {ids}" + (f" and {len(bad) - show} more" if len(bad) > show else "")
        if self.bad_count or orphans:
            text += f"; bad and orphan files are in {RunPaths(self.run_dir).quarantine_dir}"
        todo = self.bad_count + self.missing_count
        if todo:
            text += (
                f"; to redo {'it' if todo == 1 else f'these {todo} samples'}, run the retry-failed deployment with "
                f"run_dir {self.run_dir} (Prefect UI), or `eagle3 retry {self.run_dir}`"
            )
        return text


def count(n: int, noun: str) -> str:
    """`1 orphan file`, `2 orphan files`."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def verify_run(
    store: RunStore,
    *,
    full: bool = True,
    shards: list[int] | None = None,
    report: ProgressFn = no_progress,
    lock: bool = True,
) -> VerifyReport:
    """Recheck `shards` (None: all) of the store; fix manifests so the next extract redoes bad samples.

    Takes the run lock (a run that is extracting into the store is refused with RunLockedError); pass
    lock=False when the caller already holds it."""
    require_store(store.root, "nothing to verify")  # NoStoreError / NothingExtractedError, with stores nearby
    info = store.read_run_info()
    prepared = store.read_prepared_manifest()
    if prepared is None or info is None:
        raise NoStoreError(f"{store.root}: run.json without prepared/manifest.json; nothing to verify")
    wanted = list(range(len(prepared.shards))) if shards is None else shards
    unknown = [s for s in wanted if not 0 <= s < len(prepared.shards)]
    if unknown:
        raise VerifyError(f"shards {unknown} do not exist; {store.root} has shards 0..{len(prepared.shards) - 1}")
    progress = ProgressCounter("verify", sum(prepared.shards[s] for s in wanted), report)
    guard = RunLock(store.root, purpose="verify") if lock else None
    if guard is not None:
        guard.acquire()
    try:
        result = [verify_shard(store, s, info, full=full, progress=progress) for s in wanted]
    finally:
        if guard is not None:
            guard.release()
    progress.finish()
    return VerifyReport(str(store.root), full, result)


def verify_shard(
    store: RunStore, shard: int, info: RunInfo, *, full: bool = True, progress: ProgressCounter | None = None
) -> ShardVerify:
    """Verify one shard and rewrite its manifest if anything changed. The caller holds the run lock."""
    samples = store.prepared_samples(shard)
    old = store.read_manifest(shard)
    out = ShardVerify(shard, len(samples), status_before=old.status if old else None)
    out.temps_removed = remove_stale_temps(store.shard_dir(shard))
    listed = dict(old.samples) if old else {}
    errors = dict(old.errors) if old else {}
    done: dict[str, SampleEntry] = {}
    for s in samples:
        entry = listed.get(s.sample_id)
        path = store.sample_path(shard, s.sample_id)
        if not path.exists():
            if entry is not None:
                out.bad[s.sample_id] = "listed in the manifest but the file is missing"
            else:
                out.missing.append(s.sample_id)
            if progress:
                progress.add(1, failed=1 if entry is not None else 0)
            continue
        try:
            new = check_sample(path, s, info, entry, full=full)
        except SampleFormatError as e:
            out.bad[s.sample_id] = str(e)
            out.quarantined.append(str(quarantine(store, shard, path)))
            if progress:
                progress.add(1, failed=1)
            continue
        done[s.sample_id] = new
        out.ok += 1
        if entry is None:
            out.adopted.append(s.sample_id)
        if progress:
            progress.add(1, tokens=len(s))
    for path in orphan_files(store, shard, samples):
        out.orphans.append(path.name)
        out.quarantined.append(str(quarantine(store, shard, path)))
    for sid, reason in out.bad.items():
        errors[sid] = f"verify: {reason}"
    errors = {sid: r for sid, r in errors.items() if sid not in done}
    status = new_status(old, samples, done, errors, bool(out.bad))
    out.status_after = status if old is not None or done or errors else None
    if old is None and not done and not errors:
        return out
    manifest = (old or ShardManifest(shard=shard, expected=len(samples))).model_copy(deep=True)
    if (manifest.samples, manifest.errors, manifest.status, manifest.expected) != (done, errors, status, len(samples)):
        manifest.samples, manifest.errors, manifest.status, manifest.expected = done, errors, status, len(samples)
        store.write_manifest(manifest)
    return out


def check_sample(
    path: Path, sample: PreparedSample, info: RunInfo, entry: SampleEntry | None, *, full: bool
) -> SampleEntry:
    """The manifest entry of a sound file; raises SampleFormatError naming the file and the problem."""
    k, h, dtype = len(info.aux_layers), info.hidden_size, info.stored
    if not full:
        check_header(path, num_tokens=len(sample), num_aux=k, hidden_size=h, dtype=dtype)
        size = path.stat().st_size
        if entry is not None and entry.num_bytes != size:
            raise SampleFormatError(f"{path}: {size} bytes, the manifest recorded {entry.num_bytes}")
        if entry is not None:
            return entry
        rec = record_of(path.read_bytes())
        return SampleEntry(num_tokens=rec.num_tokens, num_bytes=rec.num_bytes, crc32=rec.crc32)
    rec = verify_sample(
        path,
        num_tokens=len(sample),
        num_aux=k,
        hidden_size=h,
        dtype=dtype,
        crc32=entry.crc32 if entry is not None else None,
        input_ids=torch.tensor(sample.input_ids, dtype=torch.int64),
    )
    with safe_open(str(path), framework="pt") as f:
        written_for = (f.metadata() or {}).get("sample_id")
        mask = f.get_tensor("loss_mask")  # [T] uint8
    if written_for != sample.sample_id:
        raise SampleFormatError(f"{path}: written for sample {written_for!r}, expected {sample.sample_id!r}")
    if mask.tolist() != list(sample.loss_mask):
        raise SampleFormatError(f"{path}: loss mask differs from the prepared sample")
    return SampleEntry(num_tokens=rec.num_tokens, num_bytes=rec.num_bytes, crc32=rec.crc32)


def new_status(
    old: ShardManifest | None,
    samples: list[PreparedSample],
    done: dict[str, SampleEntry],
    errors: dict[str, str],
    found_bad: bool,
) -> ShardStatus:
    if len(done) == len(samples) and not errors:
        return "complete"
    if found_bad or errors:
        return "partial" if done else "failed"
    if old is None or old.status in ("complete", "running"):  # verify holds the lock: "running" is a killed run
        return "partial" if done else "pending"
    return old.status


def orphan_files(store: RunStore, shard: int, samples: list[PreparedSample]) -> list[Path]:
    d = store.shard_dir(shard)
    if not d.is_dir():
        return []
    names = {store.sample_name(s.sample_id) for s in samples}
    return sorted(p for p in d.glob(f"*{SAMPLE_SUFFIX}") if p.name not in names)


def quarantine(store: RunStore, shard: int, path: Path) -> Path:
    """Move a file out of the shard into <run_dir>/quarantine/shard-NNNNN/ (a rename: same filesystem)."""
    dest_dir = store.quarantine_shard_dir(shard)
    dest_dir.mkdir(parents=True, exist_ok=True)
    dest, n = dest_dir / path.name, 0
    while dest.exists():
        n += 1
        dest = dest_dir / f"{path.name}.{n}"
    os.replace(path, dest)
    fsync_dir(path.parent)
    return dest
