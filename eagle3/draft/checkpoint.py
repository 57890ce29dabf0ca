"""Atomic training checkpoints: tensors in safetensors, everything else in JSON; no pickle.

    <out_dir>/checkpoints/step-00000200/
        model.safetensors       trainable draft weights + d2t/t2d in SGLang's key names, fp32 (no embedding:
                                it is the target's, reloaded from the target model)
        optimizer.safetensors   AdamW moments, "<param>.exp_avg" / "<param>.exp_avg_sq"
        rng.safetensors         torch CPU (and CUDA) generator states
        state.json              step, data position, AdamW per-parameter step and group lr, scheduler state,
                                the training config
    <out_dir>/checkpoints/latest.json   {"step": 200, "dir": "step-00000200"}

A checkpoint is written under `.step-00000200.tmp/`, each file fsynced, then renamed into place, then
latest.json is replaced: a directory named step-* is complete, and a kill at any moment leaves either the
previous checkpoint or the new one. Resume reads latest.json, or the newest complete step-* directory.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save

from eagle3.fsio import atomic_write_bytes, atomic_write_json, fsync_dir, read_json

CKPT_FORMAT = "eagle3-train-checkpoint/1"
WEIGHTS = "model.safetensors"  # the draft's trainable weights; export and evaluation read only this file
FILES = (WEIGHTS, "optimizer.safetensors", "rng.safetensors", "state.json")


class CheckpointError(ValueError):
    """A checkpoint that does not match the model or optimizer being resumed; names the directory."""


def step_dir(root: Path, step: int) -> Path:
    return Path(root) / f"step-{step:08d}"


def _cpu(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", copy=True).contiguous()


def _trainable(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def save_checkpoint(
    root: Path,
    step: int,
    model: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    state: dict[str, Any],
    keep: int,
) -> Path:
    """Write checkpoint `step` atomically and drop all but the newest `keep`. Call on one rank only."""
    root = Path(root)
    final = step_dir(root, step)
    tmp = root / f".{final.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)

    weights = {k: _cpu(v) for k, v in model.trainable_state_dict().items()}
    moments, steps = {}, {}
    for name, p in _trainable(model):
        st = optimizer.state.get(p, {})
        if st:
            moments[f"{name}.exp_avg"] = _cpu(st["exp_avg"])
            moments[f"{name}.exp_avg_sq"] = _cpu(st["exp_avg_sq"])
            steps[name] = float(st["step"])
    rng = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["torch_cuda"] = torch.cuda.get_rng_state()
    meta = {"format": CKPT_FORMAT, "step": str(step)}
    atomic_write_bytes(tmp / "model.safetensors", save(weights, metadata=meta))
    atomic_write_bytes(tmp / "optimizer.safetensors", save(moments, metadata=meta) if moments else save({}))
    atomic_write_bytes(tmp / "rng.safetensors", save(rng, metadata=meta))
    atomic_write_json(
        tmp / "state.json",
        {
            "format": CKPT_FORMAT,
            "step": step,
            **state,
            "optimizer": {"param_steps": steps, "lr": [g["lr"] for g in optimizer.param_groups]},
            "scheduler": scheduler.state_dict(),
        },
    )

    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    fsync_dir(root)
    atomic_write_json(root / "latest.json", {"step": step, "dir": final.name})
    for old in sorted(root.glob("step-*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _complete(d: Path) -> bool:
    return all((d / f).is_file() for f in FILES)


def latest_checkpoint(root: Path) -> Path | None:
    """The checkpoint to resume from: latest.json's, else the newest complete step-* directory."""
    root = Path(root)
    try:
        d = root / read_json(root / "latest.json")["dir"]
        if _complete(d):
            return d
    except (OSError, ValueError, KeyError, TypeError):
        pass
    done = [d for d in sorted(root.glob("step-*")) if _complete(d)]
    return done[-1] if done else None


def resolve_checkpoint(path: Path) -> Path:
    """A step directory (holds model.safetensors), or a checkpoints root / training out_dir (its latest)."""
    path = Path(path)
    if (path / WEIGHTS).is_file():
        return path
    for root in (path, path / "checkpoints"):
        found = latest_checkpoint(root)
        if found is not None:
            return found
    raise CheckpointError(
        f"{path}: no checkpoint here (neither <step dir>/{WEIGHTS} nor a checkpoints/ root with a complete step-*)"
    )


def load_checkpoint(
    path: Path, model: Any, optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler
) -> dict[str, Any]:
    """Restore weights, AdamW state, scheduler and RNG from `path`; returns state.json."""
    path = Path(path)
    state = read_json(path / "state.json")
    if state.get("format") != CKPT_FORMAT:
        raise CheckpointError(f"{path}: format {state.get('format')!r}, expected {CKPT_FORMAT!r}")
    weights = load_file(str(path / "model.safetensors"))
    expected = set(model.trainable_state_dict())
    if set(weights) != expected:
        raise CheckpointError(
            f"{path}: weights do not match the draft: missing {sorted(expected - set(weights))}, "
            f"unexpected {sorted(set(weights) - expected)} (was it written for another target or vocab map?)"
        )
    for k, v in model.trainable_state_dict().items():
        if v.shape != weights[k].shape:
            raise CheckpointError(f"{path}: {k} is {tuple(weights[k].shape)}, the draft has {tuple(v.shape)}")
    model.load_state_dict(weights, strict=False)

    moments = load_file(str(path / "optimizer.safetensors"))
    sd = optimizer.state_dict()
    names = [n for n, _ in _trainable(model)]
    steps = state["optimizer"]["param_steps"]
    for idx, name in enumerate(names):
        if name in steps:
            sd["state"][idx] = {
                "step": torch.tensor(steps[name], dtype=torch.float32),
                "exp_avg": moments[f"{name}.exp_avg"],
                "exp_avg_sq": moments[f"{name}.exp_avg_sq"],
            }
    for group, lr in zip(sd["param_groups"], state["optimizer"]["lr"], strict=True):
        group["lr"] = lr
    optimizer.load_state_dict(sd)
    scheduler.load_state_dict(state["scheduler"])

    rng = load_file(str(path / "rng.safetensors"))
    torch.set_rng_state(rng["torch_cpu"])
    if "torch_cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["torch_cuda"])
    return state
