"""Atomic training checkpoints: tensors in safetensors, everything else in JSON; no pickle.

    <out_dir>/checkpoints/step-00000200/
        model.safetensors       trainable draft weights + d2t/t2d in SGLang's key names, fp32 (no embedding:
                                it is the target's, reloaded from the target model)
        optimizer.safetensors   AdamW moments, "<param>.exp_avg" / "<param>.exp_avg_sq"
        rng.safetensors         torch CPU (and CUDA) generator states
        state.json              step, data position, AdamW per-parameter step and group lr, scheduler state,
                                the training config
    <out_dir>/checkpoints/latest.json   {"step": 200, "dir": "step-00000200"}
    <out_dir>/checkpoints/best.json     {"step": 200, "dir": "step-00000200", "acceptance_length": 1.8, "k": 3}
                                        (train.select = best only)

A checkpoint is written under `.step-00000200.tmp/`, each file fsynced, then renamed into place, then
latest.json is replaced: a directory named step-* is complete, and a kill at any moment leaves either the
previous checkpoint or the new one. Resume reads latest.json, or the newest complete step-* directory.

With train.select = best, each state.json holds the held-out measurement ("heldout", eagle3/draft/heldout.py) and
best.json names the complete checkpoint with the highest held-out acceptance length (the earliest of equals). It
is rewritten (atomically) after latest.json and before pruning, and pruning never removes it, so a kill at any
moment loses no best checkpoint; `select_best` recomputes it from the state.json files on disk, which the trainer
also does on resume (a kill between latest.json and best.json). `resolve_checkpoint`, which export, evaluation and
promotion use to find "the trained draft" of a training, takes best.json's checkpoint when there is one.

The tensors are always whole, whatever the run's parallelism: under FSDP2 (DTensor parameters and AdamW
moments, train.parallel = fsdp) `gather_tensors` all-gathers each one (a collective: every rank calls it, rank 0
keeps them and writes), and `load_checkpoint` (every rank reads the files) gives each rank its own shard of
each. So a checkpoint moves freely between ddp and fsdp and between world sizes, and export reads it as it is.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

import torch
from safetensors.torch import load_file, save

from eagle3.store.fsio import atomic_write_bytes, atomic_write_json, fsync_dir, read_json
from eagle3.store.paths import TrainPaths

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

CKPT_FORMAT = "eagle3-train-checkpoint/1"
WEIGHTS = "model.safetensors"  # the draft's trainable weights; export and evaluation read only this file
STATE = "state.json"
LATEST = "latest.json"
BEST = "best.json"
FILES = (WEIGHTS, "optimizer.safetensors", "rng.safetensors", STATE)


class CheckpointError(ValueError):
    """A checkpoint that does not match the model or optimizer being resumed; names the directory."""


def step_dir(root: Path, step: int) -> Path:
    return Path(root) / f"step-{step:08d}"


def step_dirs(root: Path) -> list[Path]:
    """The step directories under a checkpoints root, oldest first."""
    return sorted(Path(root).glob("step-*"))


def read_state(ckpt: Path) -> dict[str, Any]:
    """A checkpoint's state.json (step, total_steps, the training config, ...)."""
    return read_json(Path(ckpt) / STATE)  # type: ignore[no-any-return]


def _read_pointer(root: Path, name: str) -> tuple[int, Path] | None:
    """(step, directory) that `root`/`name` (latest.json, best.json) names (the directory may since have gone),
    None without one."""
    path = Path(root) / name
    if not path.is_file():
        return None
    pointer = read_json(path)
    return int(pointer["step"]), Path(root) / pointer["dir"]


def read_latest(root: Path) -> tuple[int, Path] | None:
    """(step, directory) that `root`/latest.json names, None without one."""
    return _read_pointer(root, LATEST)


def _is_dtensor(t: object) -> TypeGuard[DTensor]:
    """A DTensor exists only once torch.distributed.tensor is imported (FSDP2 imports it). Not importing it here
    saves every process that reads a checkpoint path (each flow run's, through tasks) about a second of imports."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(t, module.DTensor)


def _cpu(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor, on the CPU; a DTensor (an FSDP2 shard) is all-gathered first: a collective."""
    if _is_dtensor(t):
        t = t.full_tensor()
    return t.detach().to("cpu", copy=True).contiguous()


def _like(full: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """`full` laid out as `ref`: this rank's shard of it when `ref` is a DTensor (each rank read the whole tensor
    from the file, so slicing is local, no communication), else `full` itself."""
    if _is_dtensor(ref):
        from torch.distributed.tensor import distribute_tensor

        return distribute_tensor(full.to(ref.device, ref.dtype), ref.device_mesh, ref.placements, src_data_rank=None)
    return full


def _trainable(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


@dataclass
class CheckpointTensors:
    """What model.safetensors and optimizer.safetensors hold: whole fp32 tensors on the CPU, by parameter name."""

    weights: dict[str, torch.Tensor] = field(default_factory=dict)
    moments: dict[str, torch.Tensor] = field(default_factory=dict)  # "<param>.exp_avg", "<param>.exp_avg_sq"
    steps: dict[str, float] = field(default_factory=dict)  # AdamW's per-parameter step


def gather_tensors(model: Any, optimizer: torch.optim.Optimizer, *, keep: bool = True) -> CheckpointTensors:
    """The checkpoint's tensors, whole. Sharded (FSDP2) ones are all-gathered one at a time, so under FSDP2 every
    rank must call this, in step; the ranks that do not write pass keep=False and hold none of them."""
    out = CheckpointTensors()

    def put(into: dict[str, torch.Tensor], key: str, t: torch.Tensor) -> None:
        if keep:
            into[key] = _cpu(t)
        elif _is_dtensor(t):
            t.full_tensor()  # this rank's part in the all-gather; the writing rank keeps the result

    for k, v in model.trainable_state_dict().items():
        put(out.weights, k, v)
    for name, p in _trainable(model):
        st = optimizer.state.get(p, {})
        if st:
            put(out.moments, f"{name}.exp_avg", st["exp_avg"])
            put(out.moments, f"{name}.exp_avg_sq", st["exp_avg_sq"])
            step = st["step"]
            out.steps[name] = float(step.full_tensor() if _is_dtensor(step) else step)
    return out


def save_checkpoint(
    root: Path,
    step: int,
    model: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    state: dict[str, Any],
    keep: int,
    tensors: CheckpointTensors | None = None,
    select: str = "last",
) -> Path:
    """Write checkpoint `step` atomically and drop all but the newest `keep` (with select="best": and the best,
    which best.json names). Call on one rank only; a sharded (FSDP2) model's `tensors` come from gather_tensors,
    called on every rank."""
    root = Path(root)
    final = step_dir(root, step)
    tmp = root / f".{final.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)

    t = tensors if tensors is not None else gather_tensors(model, optimizer)
    weights, moments, steps = t.weights, t.moments, t.steps
    rng = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["torch_cuda"] = torch.cuda.get_rng_state()
    meta = {"format": CKPT_FORMAT, "step": str(step)}
    atomic_write_bytes(tmp / WEIGHTS, save(weights, metadata=meta))
    atomic_write_bytes(tmp / "optimizer.safetensors", save(moments, metadata=meta) if moments else save({}))
    atomic_write_bytes(tmp / "rng.safetensors", save(rng, metadata=meta))
    atomic_write_json(
        tmp / STATE,
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
    atomic_write_json(root / LATEST, {"step": step, "dir": final.name})
    best = select_best(root) if select == "best" else None
    for old in step_dirs(root)[:-keep]:
        if old != best:
            shutil.rmtree(old, ignore_errors=True)
    return final


def _complete(d: Path) -> bool:
    return all((d / f).is_file() for f in FILES)


def latest_checkpoint(root: Path) -> Path | None:
    """The checkpoint to resume from: latest.json's, else the newest complete step-* directory."""
    root = Path(root)
    try:
        latest = read_latest(root)
        if latest is not None and _complete(latest[1]):
            return latest[1]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    done = [d for d in step_dirs(root) if _complete(d)]
    return done[-1] if done else None


def heldout_acceptance(ckpt: Path) -> float | None:
    """The held-out acceptance length state.json recorded for a checkpoint, None without one."""
    try:
        return float(read_state(ckpt)["heldout"]["acceptance_length"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _best_on_disk(root: Path) -> Path | None:
    """The complete checkpoint with the highest held-out acceptance length (the earliest of equals)."""
    scored = [(a, d) for d in step_dirs(root) if _complete(d) and (a := heldout_acceptance(d)) is not None]
    return max(scored, key=lambda ad: (ad[0], -int(ad[1].name.removeprefix("step-"))))[1] if scored else None


def read_best(root: Path) -> tuple[int, Path] | None:
    """(step, directory) that `root`/best.json names, None without one."""
    return _read_pointer(root, BEST)


def select_best(root: Path) -> Path | None:
    """Point best.json (atomically) at the best complete checkpoint on disk by held-out acceptance; returns it."""
    root = Path(root)
    best = _best_on_disk(root)
    if best is None:
        return None
    record = read_state(best)
    entry = {
        "step": int(record["step"]),
        "dir": best.name,
        "acceptance_length": float(record["heldout"]["acceptance_length"]),
        "k": int(record["heldout"]["k"]),
    }
    try:
        same = read_json(root / BEST) == entry
    except (OSError, ValueError):
        same = False
    if not same:
        atomic_write_json(root / BEST, entry)
    return best


def best_checkpoint(root: Path) -> Path | None:
    """best.json's checkpoint (train.select = best), else None. A best.json whose directory is incomplete (a kill
    while it was being replaced) yields the best complete one on disk."""
    root = Path(root)
    try:
        best = read_best(root)
    except (OSError, ValueError, KeyError, TypeError):
        best = (0, root / ".unreadable")
    if best is None:
        return None
    return best[1] if _complete(best[1]) else _best_on_disk(root)


def resolve_checkpoint(path: Path) -> Path:
    """The trained draft: a step directory (holds model.safetensors) as it is, or, for a checkpoints root / training
    out_dir, its best checkpoint (best.json, train.select = best) or else its latest."""
    path = Path(path)
    if (path / WEIGHTS).is_file():
        return path
    for root in (path, TrainPaths(path).checkpoints_dir):
        found = best_checkpoint(root) or latest_checkpoint(root)
        if found is not None:
            return found
    raise CheckpointError(
        f"{path}: no checkpoint here (neither <step dir>/{WEIGHTS} nor a checkpoints/ root with a complete step-*)"
    )


def load_checkpoint(
    path: Path, model: Any, optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler
) -> dict[str, Any]:
    """Restore weights, AdamW state, scheduler and RNG from `path`; returns state.json. Every rank calls it and
    reads the whole files; a sharded (FSDP2) model and its optimizer take their own shard of each tensor."""
    path = Path(path)
    state = read_state(path)
    if state.get("format") != CKPT_FORMAT:
        raise CheckpointError(f"{path}: format {state.get('format')!r}, expected {CKPT_FORMAT!r}")
    weights = load_file(str(path / WEIGHTS))
    expected = set(model.trainable_state_dict())
    if set(weights) != expected:
        raise CheckpointError(
            f"{path}: weights do not match the draft: missing {sorted(expected - set(weights))}, "
            f"unexpected {sorted(set(weights) - expected)} (was it written for another target or vocab map?)"
        )
    current = model.trainable_state_dict()
    for k, v in current.items():
        if v.shape != weights[k].shape:
            raise CheckpointError(f"{path}: {k} is {tuple(weights[k].shape)}, the draft has {tuple(v.shape)}")
    model.load_state_dict({k: _like(v, current[k]) for k, v in weights.items()}, strict=False)

    moments = load_file(str(path / "optimizer.safetensors"))
    sd = optimizer.state_dict()
    steps = state["optimizer"]["param_steps"]
    for idx, (name, p) in enumerate(_trainable(model)):
        if name in steps:
            sd["state"][idx] = {
                "step": torch.tensor(steps[name], dtype=torch.float32),
                "exp_avg": _like(moments[f"{name}.exp_avg"], p),
                "exp_avg_sq": _like(moments[f"{name}.exp_avg_sq"], p),
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
