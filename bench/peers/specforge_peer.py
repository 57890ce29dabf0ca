"""SpecForge 0.2.0 as a client of our store: our export in, `specforge train` (its one entry point, a typed YAML
config), `specforge export --to sglang`, back through our import.

    side = train_specforge(cfg, work, specforge=".venv-specforge/bin/specforge")   # -> Side

1. export_specforge(store) writes its offline .ckpt layout and our vocab map (eagle3/convert/specforge.py); the rows
   our trainer holds out are left out (the copy links the training split's files only).
2. A run config with our draft (the SGLang draft config our export writes: same shape, layer ids in SGLang's
   convention), data, steps, batch tokens, lr schedule and TTT depth; SETTINGS_DIFFERENCES lists the rest.
3. Its checkpoint -> `specforge export --to sglang` -> import_sglang_draft (eagle3/convert/peer_drafts.py).

On this CPU box its trainer stops at its loss: the EAGLE-3 KL (specforge/core/loss.py LogSoftmaxLoss) is a Triton
kernel with no CPU path ("0 active drivers"); the bench shows that error in its row. Steps 2-3 after training have
not run here (no GPU with its environment: the device machines reach no package registry, and its venv is 11 GB).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from safetensors import safe_open

from bench.peers.side import REPO, Side
from eagle3.config import PipelineConfig
from eagle3.convert import export_specforge, hf_to_specforge, import_sglang_draft
from eagle3.convert.common import read_sidecar
from eagle3.convert.specforge import specforge_path
from eagle3.draft.heldout import is_heldout
from eagle3.draft.methods import method_named
from eagle3.draft.shape import DraftConfig
from eagle3.store.fsio import read_json
from eagle3.store.run_store import RunStore

SPECFORGE = REPO / ".venv-specforge" / "bin" / "specforge"

SETTINGS_DIFFERENCES = [
    "warm-up: theirs a ratio of the steps (training.warmup_ratio = train.warmup_steps / train.max_steps)",
    "batch: theirs one sample per micro-batch padded to data.max_length (training.batch_size=1), ours packs "
    "train.batch_tokens",
    "precision: theirs bf16 (model.torch_dtype; float32 fails on our bf16 store: 'expected m1 and m2 to have the "
    "same dtype'), ours train.precision",
    "TTT loss weights: theirs equal per step (kl_decay is the LK objective's), ours ttt_decay**i",
    "parallel wrapper: training.fsdp_sharding=NO_SHARD (their DDP path; their FSDP refuses a CPU)",
    "target dir: a view of the target with a model.safetensors.index.json (their lm_head loader requires one)",
]


def _target_view(model: Path, out: Path) -> tuple[Path, str]:
    """The target's files linked into `out`, plus the index.json SpecForge's TargetHead insists on; the head key."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for f in model.iterdir():
        os.symlink(f, out / f.name)
    files = sorted(model.glob("*.safetensors"))
    weight_map = {}
    for f in files:
        with safe_open(str(f), "pt") as st:
            weight_map.update({k: f.name for k in st.keys()})  # noqa: SIM118
    if not (model / "model.safetensors.index.json").is_file():
        (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    tied = bool(read_json(model / "config.json").get("tie_word_embeddings"))
    return out, "model.embed_tokens.weight" if tied and "lm_head.weight" not in weight_map else "lm_head.weight"


def _train_split(export: Path, out: Path, fraction: float) -> int:
    side = read_sidecar(export, "specforge")
    assert side is not None, f"{export}: no eagle3_export.json"
    shutil.rmtree(out, ignore_errors=True)
    kept = 0
    for s in side.samples:
        if is_heldout(s.sample_id, fraction):
            continue
        dst = specforge_path(out, s.index)
        dst.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(specforge_path(export, s.index), dst)
        kept += 1
    return kept


def run_config(cfg: PipelineConfig, work: Path, target: Path, head_key: str, layer_ids: list[int]) -> dict:
    t = cfg.train
    assert t.max_steps is not None
    return {
        "model": {"target_model_path": str(target), "lm_head_key": head_key,
                  "draft_model_config": str(work / "draft_config.json"),
                  "vocab_mapping_path": str(work / "export" / "vocab_mapping" / "vocab_mapping.pt"),
                  "aux_hidden_state_layer_ids": layer_ids, "torch_dtype": "bfloat16"},
        "data": {"hidden_states_path": str(work / "train-split"), "max_length": t.batch_tokens,
                 "dataloader_num_workers": 0},
        "training": {"max_steps": t.max_steps, "batch_size": 1, "learning_rate": t.lr,
                     "warmup_ratio": t.warmup_steps / t.max_steps, "max_grad_norm": t.grad_clip,
                     "ttt_length": t.ttt_steps, "attention_backend": "sdpa", "fsdp_sharding": "NO_SHARD",
                     "log_interval": 1, "save_interval": t.max_steps, "seed": t.seed},
        "output_dir": str(work / "out"),
    }  # fmt: skip


def train_specforge(cfg: PipelineConfig, work: Path, specforge: Path = SPECFORGE) -> Side:
    side = Side("SpecForge 0.2.0", notes=list(SETTINGS_DIFFERENCES))
    if not specforge.is_file():
        return side.failed(f"{specforge} missing: make specforge-env")
    store = RunStore(cfg.run_dir)
    info = store.require_run_info()
    export = work / "export"
    if not (export / "eagle3_export.json").is_file() or not list(export.rglob("*.ckpt")):
        shutil.rmtree(export, ignore_errors=True)
        export_specforge(store, export, workers=2)
    rows = _train_split(export, work / "train-split", cfg.train.heldout_fraction)
    side.notes.append(f"their data: {rows} files of our export (our training split)")
    ids = hf_to_specforge(info.aux_layers)  # output-of-layer ids (Llama family: HF index - 1)
    target_cfg = read_json(Path(cfg.model) / "config.json")
    dcfg = DraftConfig.from_target(target_cfg, num_aux=len(ids), draft_vocab_size=cfg.train.draft_vocab_size)
    sglang = method_named("eagle3").sglang_config(dcfg, ids)
    (work / "draft_config.json").write_text(json.dumps(sglang))
    target, head_key = _target_view(Path(cfg.model), work / "target-view")
    shutil.rmtree(work / "out", ignore_errors=True)
    (work / "run.json").write_text(json.dumps(run_config(cfg, work, target, head_key, ids), indent=1))
    argv = [str(specforge), "train", "--config", str(work / "run.json")]
    side.command = " ".join(argv)
    env = {**os.environ, "PYTHONPATH": ""}
    with open(work / "train.log", "w") as log:
        proc = subprocess.run(argv, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        return side.failed(f"`specforge train` exited {proc.returncode}: {side.last_error(work / 'train.log')}")
    sglang_dir = work / "sglang-draft"
    export_argv = [str(specforge), "export", "--to", "sglang", "--checkpoint", str(work / "out"),
                   "--draft-config", str(work / "draft_config.json"), "--output-dir", str(sglang_dir)]  # fmt: skip
    with open(work / "export.log", "w") as log:
        proc = subprocess.run(export_argv, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        return side.failed(f"`specforge export` exited {proc.returncode}: {side.last_error(work / 'export.log')}")
    imported = import_sglang_draft(sglang_dir, work / "imported", list(info.aux_layers))
    side.checkpoint = Path(imported.out_dir)
    side.notes.append("no per-step timings read from its log yet: tokens/s and first step are blank")
    return side
