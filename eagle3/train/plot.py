"""The training curves as one PNG (loss and per-TTT-step accuracy against the step), and the per-step table."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from eagle3.store.fsio import atomic_write_bytes


def ttt_table(record: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per TTT step of a metrics record: the step's loss and accuracy (0 = the next token)."""
    return [
        {"ttt_step": i, "loss": round(loss, 4), "accuracy": round(acc, 4)}
        for i, (loss, acc) in enumerate(zip(record["step_loss"], record["step_acc"], strict=True))
    ]


def curves_png(records: list[dict[str, Any]]) -> bytes:
    """Loss (left) and accuracy of each TTT step (right) against the optimizer step."""
    import matplotlib

    matplotlib.use("Agg")  # no display; must precede pyplot
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in records]
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 3.6), dpi=90)
    ax_loss.plot(steps, [r["loss"] for r in records], color="black")
    ax_loss.set(xlabel="step", ylabel="loss (weighted TTT sum)", title="loss")
    k = len(records[0]["step_acc"]) if records else 0
    for i in range(k):
        ax_acc.plot(steps, [r["step_acc"][i] for r in records], label=f"step {i}")
    ax_acc.set(xlabel="step", ylabel="accuracy", title="accuracy per TTT step", ylim=(0, 1))
    if k:
        ax_acc.legend(fontsize=7, ncol=2)
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def write_curves(records: list[dict[str, Any]], path: Path) -> bytes:
    png = curves_png(records)
    atomic_write_bytes(Path(path), png)
    return png
