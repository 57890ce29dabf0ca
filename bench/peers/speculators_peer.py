"""speculators 0.9.0 as a client of our store: our export in, their trainer, their checkpoint back through our import.

    side = train_speculators(cfg, work, python=".venv-speculators/bin/python")   # -> Side (bench/peers/side.py)

1. export_speculators(store, final_norm=the target's) writes their offline layout (eagle3/convert/speculators.py);
   the rows our trainer holds out (train.heldout_fraction, by prompt) are left out of the copy they train on, so both
   sides train on the same samples.
2. `speculators train` (bench/peers/speculators_train.py, in their venv) with our draft shape, data, steps, batch
   tokens, lr schedule and TTT depth; SETTINGS_DIFFERENCES lists what cannot be made equal.
3. import_speculators_draft (eagle3/convert/peer_drafts.py) turns their checkpoint into one of ours, which the bench
   measures with our held-out loss and our offline evaluator.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import torch

from bench.peers.side import REPO, Side
from eagle3.config import PipelineConfig
from eagle3.convert import FinalNorm, export_speculators, import_speculators_draft
from eagle3.convert.common import read_sidecar
from eagle3.draft.heldout import is_heldout
from eagle3.store.run_store import RunStore

PYTHON = REPO / ".venv-speculators" / "bin" / "python"

#: What their CLI cannot be told to do as we do (each is printed with the table).
SETTINGS_DIFFERENCES = [
    "grad clip: theirs 1.0 (hard-coded in speculators/train/trainer.py), ours train.grad_clip",
    "AdamW betas: theirs torch's default (0.9, 0.999), ours (0.9, 0.95)",
    "lr warm-up: theirs from 0 at step 1 (transformers' schedule), ours from lr/warmup at step 1; both cosine to 0",
    "held-out slice: their trainer always keeps one (train_data_ratio < 1): 0.99 of our training rows train",
    "data order: their sampler (seeded multipack), ours (BatchStream, train.seed); the same rows and batch tokens",
    "attention: theirs sdpa with a sliding window of 2048 (longer than any demo row), ours explicit scores by blocks "
    "of queries over their documents' keys (CPU) or compiled FlexAttention (CUDA)",
    "loss: theirs KL(target || draft) over the draft vocabulary at every labelled position, eager (their fused one "
    "needs Triton); ours the soft cross-entropy against the same renormalized target (the same gradient: they differ "
    "by the target entropy), skipping a position whose target argmax is outside the draft vocabulary, as SpecForge",
    "CPU only: two device shims in their trainer (speculators_train.py docstring)",
]


def _train_split(export: Path, out: Path, fraction: float) -> int:
    """`out`: the export's rows whose sample is not held out, hidden-state files linked, vocab map copied."""
    import datasets

    side = read_sidecar(export, "speculators")
    assert side is not None, f"{export}: no eagle3_export.json"
    keep = [s.index for s in side.samples if not is_heldout(s.sample_id, fraction)]
    shutil.rmtree(out, ignore_errors=True)
    (out / "hidden_states").mkdir(parents=True)
    ds = datasets.load_from_disk(str(export)).select(keep)
    ds.save_to_disk(str(out))
    for new, old in enumerate(keep):
        os.symlink(export / "hidden_states" / f"hs_{old}.safetensors", out / "hidden_states" / f"hs_{new}.safetensors")
    for name in ("d2t.npy", "t2d.npy"):
        shutil.copy(export / name, out / name)
    return len(keep)


def flags(cfg: PipelineConfig, data: Path, save: Path, aux_layers: list[int]) -> list[str]:
    """`speculators train` flags that set their run equal to ours (train section) where their CLI allows."""
    t = cfg.train
    bf16 = t.precision == "bf16" or (t.precision == "auto" and torch.cuda.is_available())  # ours: trainer.py
    return [
        "--verifier-name-or-path", str(cfg.model), "--data-path", str(data),
        "--d2t-path", str(data / "d2t.npy"), "--t2d-path", str(data / "t2d.npy"),
        "--target-layer-ids", *[str(x) for x in aux_layers],  # vLLM ids of the aux layers = our HF indices
        # our EAGLE-3 draft: one llama layer, un-normed first residual, no fc / output norms, frozen embedding
        "--num-layers", "1", "--draft-arch", "llama",
        "--no-norm-before-residual", "--no-norm-before-fc", "--no-norm-output", "--no-embed-requires-grad",
        "--total-seq-len", str(t.batch_tokens), "--max-steps", str(t.max_steps), "--epochs", "1",
        "--ttt-steps", str(t.ttt_steps), "--ttt-step-loss-decay", str(t.ttt_decay),
        "--optimizer", "adamw", "--lr", str(t.lr), "--weight-decay", str(t.weight_decay),
        "--scheduler-type", "cosine", "--scheduler-warmup-steps", str(t.warmup_steps),
        "--hidden-states-dtype", "bfloat16" if bf16 else "float32",
        "--train-data-ratio", "0.99", "--seed", str(t.seed), "--num-workers", "0",
        "--draft-attn-impl", "sdpa", "--loss-implementation", "eager", "--log-freq", "1",
        "--save-path", str(save), "--no-resume-from-checkpoint",
    ]  # fmt: skip


def train_speculators(cfg: PipelineConfig, work: Path, python: Path = PYTHON) -> Side:
    side = Side("speculators 0.9.0", notes=list(SETTINGS_DIFFERENCES))
    if not python.is_file():
        return side.failed(f"{python} missing: make speculators-env")
    assert cfg.train.max_steps is not None, "the bench trains a fixed number of steps"
    store = RunStore(cfg.run_dir)
    info = store.require_run_info()
    norm = FinalNorm.from_model_dir(cfg.model)
    export = work / "export"
    if not (export / "state.json").is_file():
        shutil.rmtree(export, ignore_errors=True)
        export_speculators(store, export, final_norm=norm, workers=2)
    rows = _train_split(export, work / "train-split", cfg.train.heldout_fraction)
    side.notes.append(f"their data: {rows} rows of our export (our training split), last slot = our post-norm state")
    save = work / "checkpoints"
    shutil.rmtree(save, ignore_errors=True)
    result = work / "result.json"
    argv = [str(python), str(REPO / "bench" / "peers" / "speculators_train.py"), str(result),
            *flags(cfg, work / "train-split", save, list(info.aux_layers))]  # fmt: skip
    side.command = " ".join(argv[1:])
    env = {**os.environ, "PYTHONPATH": "", "TQDM_DISABLE": "1"}
    with open(work / "train.log", "w") as log:
        proc = subprocess.run(argv, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        return side.failed(f"their trainer exited {proc.returncode}: {side.last_error(work / 'train.log')}")
    side.read_run(json.loads(result.read_text()))
    epochs = sorted((p for p in save.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    imported = import_speculators_draft(epochs[-1], work / "imported")
    side.notes.append(f"their checkpoint {epochs[-1]} -> {imported.out_dir} (dropped {imported.dropped})")
    side.checkpoint = Path(imported.out_dir)
    return side
