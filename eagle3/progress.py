"""Progress with rate and ETA, reported through a plain callback (tasks turn it into Prefect artifacts)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Progress:
    stage: str
    done: int  # units finished (samples, steps), including skipped ones
    total: int
    tokens: int  # tokens processed by real work this session (not skipped)
    elapsed_s: float
    skipped: int = 0
    failed: int = 0
    total_tokens: int = 0  # tokens of all `total` units, where the work is measured in tokens (0: not known)
    settled_tokens: int = 0  # tokens of units finished without work this session (skipped ones, failed ones)

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total else 1.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        """Seconds left: from the token rate where the total in tokens is known (one long sample then moves
        the ETA by its length, not by one sample's share), else from the unit rate."""
        if self.total_tokens > 0 and self.tokens > 0 and self.elapsed_s > 0:
            left = max(0, self.total_tokens - self.settled_tokens - self.tokens)
            return left * self.elapsed_s / self.tokens
        worked = self.done - self.skipped
        if worked <= 0 or self.elapsed_s <= 0:
            return None
        return (self.total - self.done) * self.elapsed_s / worked

    def describe(self) -> str:
        eta = "?" if self.eta_s is None else f"{self.eta_s:.0f}s"
        return (
            f"{self.stage}: {self.done}/{self.total} ({100 * self.fraction:.1f}%), "
            f"{self.tokens_per_s:.0f} tok/s, ETA {eta}, skipped {self.skipped}, failed {self.failed}"
        )


ProgressFn = Callable[[Progress], None]


def no_progress(_: Progress) -> None:
    return None


@dataclass
class ProgressCounter:
    """Counts work and calls `report` at most every `every_s` seconds (and always on `finish`)."""

    stage: str
    total: int
    report: ProgressFn = no_progress
    every_s: float = 2.0
    done: int = 0
    tokens: int = 0
    skipped: int = 0
    failed: int = 0
    total_tokens: int = 0  # see Progress
    settled_tokens: int = 0
    _start: float = field(default_factory=time.monotonic)
    _last: float = 0.0

    def snapshot(self) -> Progress:
        elapsed = time.monotonic() - self._start
        return Progress(
            self.stage, self.done, self.total, self.tokens, elapsed, self.skipped, self.failed,
            self.total_tokens, self.settled_tokens,
        )  # fmt: skip

    def add(self, n: int = 1, tokens: int = 0, skipped: int = 0, failed: int = 0, settled_tokens: int = 0) -> None:
        """`n` units done: `tokens` of them by work, `settled_tokens` of skipped or failed ones."""
        self.done += n
        self.tokens += tokens
        self.settled_tokens += settled_tokens
        self.skipped += skipped
        self.failed += failed
        now = time.monotonic()
        if now - self._last >= self.every_s:
            self._last = now
            self.report(self.snapshot())

    def finish(self) -> Progress:
        p = self.snapshot()
        self.report(p)
        return p


@dataclass
class TokenEstimate:
    """The tokens a generation will make in all, for an ETA by tokens from the first ones (generated samples finish
    minutes apart, so counting samples reads `ETA ?` until the first does): every unit not finished yet at the mean
    of those finished, or, before any has, at its bound (`bounds`: the most each unit may generate, e.g. its turns x
    max_new_tokens)."""

    bounds: list[int]
    finished_units: int = 0
    finished_tokens: int = 0
    dropped: int = 0  # units that failed: nothing more to generate for them

    def finish(self, tokens: int) -> int:
        """One unit generated `tokens`; returns the new total."""
        self.finished_units += 1
        self.finished_tokens += tokens
        return self.total()

    def drop(self) -> int:
        """One unit failed; returns the new total."""
        self.dropped += 1
        return self.total()

    def total(self) -> int:
        if not self.finished_units:
            return sum(self.bounds)
        left = max(0, len(self.bounds) - self.finished_units - self.dropped)
        return self.finished_tokens + round(left * self.finished_tokens / self.finished_units)
