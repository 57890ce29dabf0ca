"""One side of the peers bench (ours or a peer): what its run measured and what the bench measured of its draft."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Side:
    name: str
    notes: list[str] = field(default_factory=list)  # settings that differ from ours, shims, what was imported
    command: str = ""
    error: str | None = None  # why this side has no numbers
    steps: list[dict[str, Any]] = field(default_factory=list)  # logged steps: t (s since start), step, loss, tokens
    peak_rss_mb: float | None = None
    peak_gpu_mb: float | None = None  # torch's peak allocated on the GPU (a CUDA run)
    checkpoint: Path | None = None  # a checkpoint directory of ours (a peer's: imported)
    heldout: dict[str, Any] | None = None  # our Trainer's held-out record of the checkpoint
    acceptance: dict[tuple[str, int], float] = field(default_factory=dict)  # (set, k) -> acceptance length

    def failed(self, error: str) -> Side:
        self.error = error
        return self

    def read_run(self, run: dict[str, Any]) -> None:
        self.steps, self.peak_rss_mb, self.peak_gpu_mb = run["steps"], run["peak_rss_mb"], run.get("peak_gpu_mb")
        self.notes += [f"shim: {s}" for s in run.get("shims", [])]

    @staticmethod
    def last_error(log: Path) -> str:
        """The last line of a log that names an error (the exception line of a traceback)."""
        lines = [x.strip() for x in log.read_text(errors="replace").splitlines() if x.strip()]
        errors = [x for x in lines if "Error" in x or "error:" in x]
        return (errors or lines or ["(empty log)"])[-1][:400]

    @property
    def first_step_s(self) -> float | None:
        """Seconds from process start to the end of the first optimizer step (imports, build, load, step)."""
        return self.steps[0]["t"] if self.steps else None

    @property
    def tokens_per_s(self) -> float | None:
        """Training tokens per second after the first step (steady state), from the steps' own timestamps."""
        if len(self.steps) < 2:
            return None
        tokens = sum(s["tokens"] for s in self.steps[1:])
        return tokens / (self.steps[-1]["t"] - self.steps[0]["t"])

    @property
    def tokens_per_cpu_s(self) -> float | None:
        """Training tokens per CPU second of the side's process (all its threads) after the first step: on a shared
        machine steadier than tokens/s, which counts the seconds other jobs held the cores."""
        if len(self.steps) < 2 or "cpu" not in self.steps[0]:
            return None
        tokens = sum(s["tokens"] for s in self.steps[1:])
        return tokens / (self.steps[-1]["cpu"] - self.steps[0]["cpu"])
