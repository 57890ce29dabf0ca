"""Disk budget: will the samples still to extract fit, on the store's filesystem and on the dump directory's?

    estimate_bytes  bytes of sample files for a token count (what a sample file holds, plus overhead)
    check_budget    one filesystem (or the disk.budget_gb cap) against a need -> DiskCheck
    run_budget      before a run: every selected shard's remaining samples, from the prepared token counts
    shard_budget    before a shard: its samples that have no file yet
    DiskGuard       during a shard: called with the bytes of each write; statvfs only every N MB / seconds

Available space = free space (what an unprivileged writer may use) minus the reserve, where
reserve = max(disk.reserve_fraction x filesystem size, disk.reserve_min_gb); with disk.budget_gb set,
also at most budget - current store size. GB here is 10^9 bytes, as `df -H` shows.

A check that fails raises DiskBudgetError carrying the DiskCheck; the task layer turns
`check.as_event_payload()` into the Prefect event `eagle3.disk.low` before failing.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from eagle3.config import DiskConfig
from eagle3.store.run_store import RunInfo, RunStore
from eagle3.store.sample_format import FP8_NAME

GB = 1e9  # the one GB of the pipeline (disk.*_gb keys, doctor, the extraction's logs and tables)
MB = 1 << 20
#: Safetensors header of one sample file (measured 384..568 bytes: 4 tensors, metadata with a sample id of
#: up to 160 characters), rounded up, plus one filesystem block of slack for the file's last block.
FILE_OVERHEAD_BYTES = 1024 + 4096
#: input_ids int64 + loss_mask uint8 per token.
ID_MASK_BYTES_PER_TOKEN = 9
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3": 1}  # by run.json store_dtype
#: FP8 stores also keep one float32 scale per token per state (K aux + 1 last).
SCALE_BYTES = 4

Where = Literal["store", "dump"]


def estimate_bytes(
    num_tokens: int, num_aux: int, hidden_size: int, dtype_bytes: int, num_files: int = 1, *, scales: bool = False
) -> int:
    """Bytes on disk of `num_files` sample files holding `num_tokens` tokens in all:
    T x (K+1) x H x dtype bytes (aux + last hidden states) + T x 9 (ids, mask) + per-file overhead,
    + T x (K+1) x 4 for the float32 scales of an FP8 store (`scales`)."""
    return (
        num_tokens * (num_aux + 1) * (hidden_size * dtype_bytes + (SCALE_BYTES if scales else 0))
        + num_tokens * ID_MASK_BYTES_PER_TOKEN
        + num_files * FILE_OVERHEAD_BYTES
    )


def run_estimate(info: RunInfo, num_tokens: int, num_files: int = 1) -> int:
    """estimate_bytes with K, H and the store dtype taken from run.json."""
    fp8 = info.store_dtype == FP8_NAME
    dtype_bytes = DTYPE_BYTES[info.store_dtype]
    return estimate_bytes(num_tokens, len(info.aux_layers), info.hidden_size, dtype_bytes, num_files, scales=fp8)


def fmt_bytes(n: float) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


# one filesystem ----------------------------------------------------------------------------
@dataclass(frozen=True)
class DiskCheck:
    """One filesystem against one need. `ok` when need_bytes fits in available_bytes."""

    where: Where  # "store" (run_dir) or "dump" (extract.dump_dir on another filesystem)
    scope: str  # "run", "shard 3", "write in shard 3"
    path: str
    need_bytes: int
    free_bytes: int  # free to an unprivileged writer (statvfs f_bavail)
    total_bytes: int
    reserve_bytes: int
    reserve_fraction: float
    reserve_min_gb: float
    budget_bytes: int | None = None  # disk.budget_gb cap on the store, if set
    store_bytes: int = 0  # the store's current size, counted against the cap

    @property
    def available_bytes(self) -> int:
        avail = self.free_bytes - self.reserve_bytes
        if self.budget_bytes is not None:
            avail = min(avail, self.budget_bytes - self.store_bytes)
        return max(0, avail)

    @property
    def ok(self) -> bool:
        return self.need_bytes <= self.available_bytes

    @property
    def budget_limits(self) -> bool:
        """True when the disk.budget_gb cap, not free space, is what is short."""
        return (
            self.budget_bytes is not None
            and self.budget_bytes - self.store_bytes < self.free_bytes - self.reserve_bytes
        )

    def describe(self) -> str:
        what = "the store" if self.where == "store" else "the dump directory"
        text = (
            f"{self.scope} needs {fmt_bytes(self.need_bytes)} in {what} {self.path}; that filesystem has "
            f"{fmt_bytes(self.free_bytes)} free of {fmt_bytes(self.total_bytes)}, and keeps a reserve of "
            f"{fmt_bytes(self.reserve_bytes)} (disk.reserve_fraction={self.reserve_fraction:g} of its size, at least "
            f"disk.reserve_min_gb={self.reserve_min_gb:g})"
        )
        if self.budget_bytes is not None:
            text += (
                f"; the store holds {fmt_bytes(self.store_bytes)} of its disk.budget_gb={self.budget_bytes / GB:g} cap"
            )
        return text + f", so {fmt_bytes(self.available_bytes)} may be used"

    def remedy(self) -> str:
        if self.budget_limits:
            return "Raise disk.budget_gb, or extract fewer shards (extract.shards)."
        if self.where == "dump":
            return (
                "The dump directory holds only samples in flight: free space there (/dev/shm is RAM), lower "
                "disk.reserve_fraction / disk.reserve_min_gb, lower extract.window, or point extract.dump_dir "
                "at a larger filesystem (or leave it unset: <run_dir>/dump, no copy)."
            )
        return (
            "Free space on that filesystem, lower disk.reserve_fraction / disk.reserve_min_gb (the reserve keeps "
            "the machine usable), point run_dir at a larger filesystem, or extract fewer shards per run "
            "(extract.shards)."
        )

    def as_event_payload(self) -> dict[str, Any]:
        """Numbers for the Prefect event `eagle3.disk.low` (JSON-serialisable)."""
        return {
            "where": self.where,
            "scope": self.scope,
            "path": self.path,
            "need_bytes": self.need_bytes,
            "free_bytes": self.free_bytes,
            "total_bytes": self.total_bytes,
            "reserve_bytes": self.reserve_bytes,
            "available_bytes": self.available_bytes,
            "budget_bytes": self.budget_bytes,
            "store_bytes": self.store_bytes,
            "ok": self.ok,
        }


class DiskBudgetError(RuntimeError):
    """Not enough disk for what is about to be written. `.check` holds the numbers."""

    def __init__(self, check: DiskCheck):
        self.check = check
        super().__init__(f"not enough disk: {check.describe()}. {check.remedy()}")


def existing_dir(path: Path) -> Path:
    """`path` or its nearest existing ancestor (a run directory may not exist before the first run)."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def fs_usage(path: Path) -> tuple[int, int]:
    """(free to unprivileged writers, total) bytes of the filesystem holding `path`."""
    st = os.statvfs(existing_dir(path))
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def same_filesystem(a: Path, b: Path) -> bool:
    return existing_dir(a).stat().st_dev == existing_dir(b).stat().st_dev


def check_budget(
    path: str | Path,
    need_bytes: int,
    cfg: DiskConfig,
    *,
    where: Where = "store",
    scope: str = "run",
    store_bytes: int = 0,
) -> DiskCheck:
    """Check `need_bytes` against the filesystem of `path` (and, for the store, the disk.budget_gb cap
    given the store's current size `store_bytes`). Returns the check; raise with `require`."""
    free, total = fs_usage(Path(path))
    reserve = int(max(cfg.reserve_fraction * total, cfg.reserve_min_gb * GB))
    budget = int(cfg.budget_gb * GB) if cfg.budget_gb is not None and where == "store" else None
    return DiskCheck(
        where=where,
        scope=scope,
        path=str(path),
        need_bytes=int(need_bytes),
        free_bytes=free,
        total_bytes=total,
        reserve_bytes=reserve,
        reserve_fraction=cfg.reserve_fraction,
        reserve_min_gb=cfg.reserve_min_gb,
        budget_bytes=budget,
        store_bytes=store_bytes if budget is not None else 0,
    )


def require(checks: list[DiskCheck]) -> list[DiskCheck]:
    """Raise DiskBudgetError for the first check that fails; return the checks otherwise."""
    for c in checks:
        if not c.ok:
            raise DiskBudgetError(c)
    return checks


def store_size(store: RunStore) -> int:
    """Bytes of every file under the run directory (what disk.budget_gb caps)."""
    total = 0
    for dirpath, _, files in os.walk(store.root):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except FileNotFoundError:  # a temp file renamed away meanwhile
                continue
    return total


# needs from the prepared data ----------------------------------------------------------------
def _checks(
    store: RunStore,
    cfg: DiskConfig,
    scope: str,
    store_need: int,
    dump_dir: str | Path | None,
    dump_need: int,
) -> list[DiskCheck]:
    used = store_size(store) if cfg.budget_gb is not None else 0
    checks = [check_budget(store.root, store_need, cfg, where="store", scope=scope, store_bytes=used)]
    if dump_dir is not None and not same_filesystem(Path(dump_dir), store.root):
        checks.append(check_budget(dump_dir, dump_need, cfg, where="dump", scope=scope))
    return checks


def run_budget(
    store: RunStore,
    info: RunInfo,
    shards: list[int] | None,
    cfg: DiskConfig,
    *,
    dump_dir: str | Path | None = None,
    in_flight: int = 1,
) -> list[DiskCheck]:
    """Pre-run check: the samples of `shards` (None: all) that the shard manifests do not list as written,
    from the prepared token counts; the dump directory (when on another filesystem) must hold `in_flight`
    samples of data.max_length tokens. Raises DiskBudgetError; returns the checks when they pass."""
    prepared = store.read_prepared_manifest()
    if prepared is None:
        raise FileNotFoundError(f"{store.prepared_dir}/manifest.json missing; run the prepare stage first")
    wanted = range(len(prepared.shards)) if shards is None else shards
    tokens = files = 0
    for i in wanted:
        m = store.read_manifest(i)
        tokens += max(0, prepared.shard_tokens[i] - (m.tokens if m else 0))
        files += max(0, prepared.shards[i] - (len(m.samples) if m else 0))
    longest = int(prepared.config.get("max_length", 0)) or max(prepared.shard_tokens, default=0)
    scope = "the run" if shards is None else f"the run (shards {list(wanted)})"
    return require(
        _checks(store, cfg, scope, run_estimate(info, tokens, files), dump_dir, in_flight * run_estimate(info, longest))
    )


def shard_need(store: RunStore, info: RunInfo, shard: int) -> tuple[int, int]:
    """(estimated bytes of the samples of `shard` that have no file yet, tokens of its longest such sample)."""
    t = store.read_prepared_shard(shard).select(["sample_id", "num_tokens"]).to_pydict()
    tokens = files = longest = 0
    for sid, n in zip(t["sample_id"], t["num_tokens"], strict=True):
        if not store.sample_path(shard, sid).exists():
            tokens, files, longest = tokens + n, files + 1, max(longest, n)
    return run_estimate(info, tokens, files) if files else 0, longest


def shard_budget(
    store: RunStore,
    info: RunInfo,
    shard: int,
    cfg: DiskConfig,
    *,
    dump_dir: str | Path | None = None,
    in_flight: int = 1,
) -> list[DiskCheck]:
    """Pre-shard check: the shard's samples without a file. Raises DiskBudgetError; returns the checks."""
    need, longest = shard_need(store, info, shard)
    return require(_checks(store, cfg, f"shard {shard}", need, dump_dir, in_flight * run_estimate(info, longest)))


# during a shard ------------------------------------------------------------------------------
class DiskGuard:
    """The in-shard re-check: `guard(nbytes)` before each write raises DiskBudgetError when the write would
    eat into the reserve (another process may be filling the disk). Cheap: between statvfs calls it counts
    its own writes down from the last measurement, and measures again every `check_every_bytes` written,
    every `check_every_s` seconds, and whenever the next write would not fit the last measurement.
    Thread-safe (the extract loop writes from several threads)."""

    def __init__(
        self,
        store: RunStore,
        cfg: DiskConfig,
        *,
        scope: str = "a write",
        dump_dir: str | Path | None = None,
        check_every_bytes: int = 256 * MB,
        check_every_s: float = 10.0,
    ):
        self.store, self.cfg, self.scope = store, cfg, scope
        other_fs = dump_dir is not None and not same_filesystem(Path(dump_dir), store.root)
        self.dump_dir = Path(dump_dir) if dump_dir is not None and other_fs else None
        self.check_every_bytes, self.check_every_s = check_every_bytes, check_every_s
        self.store_bytes = store_size(store) if cfg.budget_gb is not None else 0
        self.written = 0  # bytes passed by this guard
        self.measurements = 0  # statvfs rounds so far (tests read it)
        self._lock = threading.Lock()
        self._avail = 0  # available at the last measurement, minus what was written since
        self._since = 0  # bytes passed since the last measurement
        self._at = float("-inf")

    def __call__(self, nbytes: int) -> None:
        with self._lock:
            stale = self._since >= self.check_every_bytes or time.monotonic() - self._at >= self.check_every_s
            if stale or nbytes > self._avail:
                self._measure(nbytes)
            self._avail -= nbytes
            self._since += nbytes
            self.written += nbytes

    def _measure(self, nbytes: int) -> None:
        self.measurements += 1
        used = self.store_bytes + self.written
        checks = [check_budget(self.store.root, nbytes, self.cfg, scope=self.scope, store_bytes=used)]
        if self.dump_dir is not None:
            checks.append(check_budget(self.dump_dir, nbytes, self.cfg, where="dump", scope=self.scope))
        self._at, self._since = time.monotonic(), 0
        self._avail = min(c.available_bytes for c in checks)
        require(checks)
