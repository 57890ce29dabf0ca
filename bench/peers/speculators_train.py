"""speculators' own trainer on our export, as its docs run it (`speculators train ...`: speculators.train.cli.main on
TrainConfig.resolve(argv)); run by bench/peers/speculators_peer.py with .venv-speculators' python, never ours.

    .venv-speculators/bin/python bench/peers/speculators_train.py RESULT.json <speculators train flags...>

RESULT.json: every logged step (seconds since this process started, loss, tokens), the validation record, peak RSS.
Imports nothing of ours (eagle3 is not installed in that venv).

Their `--max-steps` ends an epoch, not the epoch loop (each further epoch runs one more step), so the epochs are set
to ceil(max_steps / their batches per epoch) once their loader is built. On a machine without an accelerator two
shims more; all are recorded in RESULT.json: speculators' Trainer moves the model and
each batch to `get_local_rank()` (0, i.e. cuda:0), which fails with "Cannot access accelerator device when none is
available": here that device is "cpu"; and its step timer calls torch.accelerator.synchronize(), which fails the same
way: here a no-op (a CPU step is synchronous). Nothing else of their loop is touched.
"""

from __future__ import annotations

import time

T0 = time.monotonic()  # before torch's import: seconds to the first step include start-up

import json  # noqa: E402
import logging  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402


class _Tap(logging.Handler):
    """Collects speculators' metric records (dicts on the `speculators.metrics` logger)."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[dict[str, Any]] = []
        self.val: dict[str, Any] | None = None

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.msg
        if not isinstance(msg, dict):
            return
        if "train" in msg and isinstance(msg.get("profile"), dict):
            train, prof = msg["train"], msg["profile"]
            self.steps.append({
                "t": time.monotonic() - T0,
                "cpu": time.process_time(),  # this process's CPU seconds, all threads
                "step": int(msg["global_step"]) + 1,
                "loss": float(train.get("loss", float("nan"))),
                "tokens": round(prof["tokens_per_s"] * prof["step_ms"] / 1000),
                "step_ms": prof["step_ms"],
                "lr": msg.get("lr"),
            })  # fmt: skip
        elif "val" in msg:
            self.val = msg["val"]


def main(argv: list[str]) -> None:
    result_path, flags = Path(argv[0]), argv[1:]
    import torch
    from speculators.train import cli, trainer
    from speculators.train.config import TrainConfig

    shim = []
    if torch.accelerator.current_accelerator() is None:
        trainer.get_local_rank = lambda: "cpu"  # type: ignore[assignment,return-value]
        torch.accelerator.synchronize = lambda *a, **k: None  # their step timer's; a CPU step is synchronous
        shim += ["Trainer device: get_local_rank() -> 'cpu'", "torch.accelerator.synchronize -> no-op (CPU)"]
    tap = _Tap()
    setup = cli.setup_metric_logger

    def setup_and_tap(*a: Any, **k: Any) -> None:  # their dictConfig resets the metrics logger's handlers
        setup(*a, **k)
        logging.getLogger("speculators.metrics").addHandler(tap)

    cli.setup_metric_logger = setup_and_tap
    make_loaders, make_config = cli.create_train_val_loaders, cli.TrainerConfig
    per_epoch: list[int] = []

    def loaders(*a: Any, **k: Any) -> Any:
        train, val = make_loaders(*a, **k)
        per_epoch.append(len(train))
        return train, val

    def trainer_config(**k: Any) -> Any:  # --max-steps stops an epoch, not the epoch loop: each further epoch would
        if k.get("max_steps") and per_epoch:  # run one more step, so the epochs are exactly those max_steps needs
            k["num_epochs"] = -(-k["max_steps"] // per_epoch[0])
        return make_config(**k)

    cli.create_train_val_loaders, cli.TrainerConfig = loaders, trainer_config
    shim.append("epochs = ceil(max_steps / their batches per epoch), set once their loader is built")
    cli.main(TrainConfig.resolve(flags))
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result_path.write_text(json.dumps({
        "steps": tap.steps, "val": tap.val, "peak_rss_mb": peak_kb / 1024, "wall_s": time.monotonic() - T0,
        "shims": shim, "torch": torch.__version__, "argv": flags, "batches_per_epoch": per_epoch[:1],
        "peak_gpu_mb": torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None,
    }, indent=1))  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1:])
