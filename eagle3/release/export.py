"""Export a trained draft: the directory SGLang 0.5.23 serves, plus a speculators-style copy for vLLM.

    export_draft(checkpoint, run_dir, model_dir, out_dir) -> ExportResult
        (out_dir: in a run, <run_dir>/draft/exports/<checkpoint>-<sha12>; eagle3/release/promote.py keeps the pointers)

    <out_dir>/config.json                    LlamaForCausalLMEagle3 config (below)
    <out_dir>/model.safetensors              bf16 weights in SGLang's key names, d2t int64, t2d bool; no embedding
    <out_dir>/export.json                    ExportResult: checkpoint identity, layer ids per convention, serve args
    <out_dir>/speculators/config.json        speculators' Eagle3SpeculatorConfig layout (vLLM reads it)
    <out_dir>/speculators/model.safetensors  the same tensors with midlayer.* renamed to layers.0.*

What SGLang 0.5.23 reads (sglang/srt/models/llama_eagle3.py, speculative/eagle_worker_v2.py,
model_executor/model_runner_components/spec_aux_hidden_state.py):
  - config.json: `draft_vocab_size` (None would mean "take the target's lm_head"), `target_hidden_size`
    (fc input = K x target_hidden_size, K = len(eagle_aux_hidden_state_layer_ids)), `tie_word_embeddings`
    false (true would make lm_head the embedding), and `eagle_config.eagle_aux_hidden_state_layer_ids`, which
    the target's `set_eagle3_layers_to_capture` reads exactly as `--return-aux-hidden-state-layer-ids` in
    capture-only mode: the same per-family rule (eagle3/serving/layers.py), so the ids are the ones
    extraction used, and the draft sees at serving time the layers it was trained on.
  - weights: `midlayer.*` is renamed to `layers.0.*`, q/k/v and gate/up are fused on load; `d2t` becomes
    `hot_token_id = arange + d2t` (draft id -> target id); `t2d` is skipped; any other unknown key is dropped
    silently, hence the strict key check here. The embedding is not read from the draft: the EAGLE worker
    shares the target's (`set_embed`), as in training.

A re-export of the same checkpoint for the same run and target does no work: export.json records a key
over what makes the output valid. The directory is built under a temporary sibling, every file fsynced,
then swapped in by rename: `out_dir` is always a complete export (a kill between the two renames of the
swap leaves no `out_dir`, never a partial one; the next export rebuilds it).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field
from safetensors.torch import load_file, save

from eagle3.config import TrainConfig
from eagle3.convert.vocab import check_vocab_map
from eagle3.draft.checkpoint import STATE, WEIGHTS, CheckpointError, read_state, resolve_checkpoint
from eagle3.draft.dflash.serving import target_layer_ids
from eagle3.draft.load import checkpoint_method, checkpoint_train
from eagle3.draft.method import DraftMethod
from eagle3.draft.shape import DraftConfig
from eagle3.progress import ProgressCounter, ProgressFn, no_progress
from eagle3.serving.layers import LayerMappingError, SGLangLayers, eagle3_serving_problem, sglang_layer_ids
from eagle3.store.fsio import atomic_write_bytes, atomic_write_json, fsync_dir, read_json
from eagle3.store.paths import EXPORT_FILE, FIRST_METHOD, RunPaths
from eagle3.store.run_store import RunInfo, RunStore, now, read_record
from eagle3.target.families import RESIDUAL, TAPS, block_drafter_problem
from eagle3.target.files import ModelError, model_facts, model_fingerprint, sha256_file

EXPORT_FORMAT = "eagle3-export/1"
SPECULATORS_DIR = "speculators"


class ExportError(ValueError):
    """The checkpoint, run or target cannot make a servable draft; the message names the file and key."""


class ExportResult(BaseModel):
    """export.json: what was exported from what, and how to serve it."""

    model_config = ConfigDict(extra="forbid")
    format: str = EXPORT_FORMAT
    key: str = Field(description="sha256 over everything that makes the export valid (skip when unchanged)")
    out_dir: str
    checkpoint: str
    checkpoint_step: int | None
    checkpoint_sha256: str = Field(description="sha256 of the checkpoint's model.safetensors")
    method: str = Field("eagle3", description="train.method of the draft (docs/methods.md)")
    speculative_algorithm: str = Field("EAGLE3", description="SGLang's --speculative-algorithm for this draft")
    run_dir: str
    model_dir: str
    model_sha256: str = Field(description="fingerprint of model_dir now (eagle3.target.files.model_fingerprint)")
    run_model_sha256: str = Field(description="the fingerprint run.json recorded at extraction")
    aux_layers: list[int] = Field(description="HF hidden_states indices the draft was trained on (and reads)")
    sglang_layer_ids: list[int] = Field(description="eagle_config.eagle_aux_hidden_state_layer_ids (SGLang ids)")
    sglang_layer_convention: str
    speculators_layer_ids: list[int] = Field(description="vLLM/speculators ids (input of layer k = HF index k)")
    draft_vocab_size: int
    target_vocab_size: int
    hidden_size: int
    num_parameters: int = Field(description="trainable draft parameters (no embedding)")
    weights_bytes: int
    speculators_weights_bytes: int
    sglang_args: list[str] = Field(description="sglang.launch_server arguments that serve this draft")
    notes: list[str] = Field(default_factory=list, description="warnings worth reading (model fingerprint, ...)")
    skipped: bool = False
    created_at: str = Field(default_factory=now)


def default_export_dir(run_dir: Path, method: str = FIRST_METHOD) -> Path:
    """The method's newest export, `<run_dir>/draft/latest` for EAGLE-3 (a symlink into draft/exports/,
    eagle3/release/promote.py), `draft/<method>/latest` for another; the promoted one is `<run_dir>/draft/current`."""
    return RunPaths(run_dir).method(method).latest


def sglang_args(
    model_dir: Path,
    draft_dir: Path,
    *,
    steps: int,
    topk: int = 1,
    draft_tokens: int | None = None,
    algorithm: str = "EAGLE3",
) -> list[str]:
    return [
        "--model-path", str(model_dir),
        "--speculative-algorithm", algorithm,
        "--speculative-draft-model-path", str(draft_dir),
        "--speculative-num-steps", str(steps),
        "--speculative-eagle-topk", str(topk),
        "--speculative-num-draft-tokens", str(draft_tokens if draft_tokens is not None else steps + 1),
    ]  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------------
def _check_weights(
    path: Path, weights: dict[str, torch.Tensor], cfg: DraftConfig, method: DraftMethod, train: TrainConfig | None
) -> None:
    """The checkpoint holds exactly the draft's trainable tensors (of the draft its train settings build), in its
    shapes, and a consistent vocab map."""
    with torch.device("meta"):
        draft = method.build(cfg, train=train)
        expected = {k: tuple(v.shape) for k, v in draft.trainable_state_dict().items()}  # type: ignore[operator]
    missing, unexpected = sorted(set(expected) - set(weights)), sorted(set(weights) - set(expected))
    if missing or unexpected:
        raise ExportError(
            f"{path}: keys do not match the {method.name} draft SGLang loads: missing {missing}, "
            f"unexpected {unexpected} (SGLang would drop unknown keys silently and serve uninitialised weights)"
        )
    bad = {k: (tuple(weights[k].shape), s) for k, s in expected.items() if tuple(weights[k].shape) != s}
    if bad:
        diff = ", ".join(f"{k} {a} (expected {b})" for k, (a, b) in sorted(bad.items()))
        raise ExportError(f"{path}: shapes differ from the draft built from the target's config.json: {diff}")
    for k, v in weights.items():
        if v.is_floating_point() and not bool(torch.isfinite(v).all()):
            raise ExportError(f"{path}: {k} holds NaN or inf")
    try:
        check_vocab_map(weights["d2t"], weights["t2d"], str(path), cfg.vocab_size)
    except ValueError as e:
        raise ExportError(str(e)) from None


def _export_key(
    checkpoint_sha: str, target_cfg_sha: str, layers: list[list[int]], method: str, tokens: int, paths: list[Path]
) -> str:
    """Over what makes an export valid: its inputs, and the absolute paths written into it (serve args,
    the speculators verifier), so a moved run directory or target is exported again."""
    blob = json.dumps([EXPORT_FORMAT, checkpoint_sha, target_cfg_sha, layers, method, tokens, [str(p) for p in paths]])
    return hashlib.sha256(blob.encode()).hexdigest()


def _previous(out_dir: Path, key: str) -> ExportResult | None:
    """The export in out_dir when it was made with this key and its files are all there."""
    try:
        prev = read_export(out_dir)
    except (OSError, ValueError):
        return None
    if prev is None:
        return None
    files = {out_dir / WEIGHTS: prev.weights_bytes}
    configs = [out_dir / "config.json"]
    if prev.speculators_weights_bytes:  # a method without a speculators layout writes no copy
        files[out_dir / SPECULATORS_DIR / WEIGHTS] = prev.speculators_weights_bytes
        configs.append(out_dir / SPECULATORS_DIR / "config.json")
    intact = all(p.is_file() and p.stat().st_size == n for p, n in files.items())
    return prev if prev.key == key and intact and all(c.is_file() for c in configs) else None


def read_export(out_dir: Path) -> ExportResult | None:
    """An export directory's export.json, None when it has none."""
    return read_record(Path(out_dir) / EXPORT_FILE, ExportResult)


def _swap_in(tmp: Path, out_dir: Path) -> None:
    """Replace out_dir by the finished tmp directory (same parent) with renames."""
    old = None
    if out_dir.exists():
        old = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.old-"))
        os.replace(out_dir, old / "x")
    os.replace(tmp, out_dir)
    fsync_dir(out_dir.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def served_layer_ids(info: RunInfo, model_type: str, layers: list[int] | None = None) -> SGLangLayers:
    """The SGLang ids the draft config names: exactly those run.json recorded when SGLang extracted the store;
    for another engine, what SGLang extraction would have passed (the recorded extract.sglang_layer_ids included).
    `layers`: the store layers the draft reads (a subset of run.json's, in its order); None: all of them."""
    if info.engine == "sglang":
        whole = SGLangLayers(list(info.aux_layers), list(info.engine_layer_ids), info.engine_layer_convention)
    else:
        override = info.config.get("extract", {}).get("sglang_layer_ids")
        try:
            whole = sglang_layer_ids(model_type, info.aux_layers, info.num_layers, override)
        except LayerMappingError as e:
            raise ExportError(f"{e} (the store's run.json records the extraction config)") from None
    if layers is None or layers == whole.aux_layers:
        return whole
    missing = [x for x in layers if x not in whole.aux_layers]
    if missing:
        raise ExportError(f"the draft reads aux layers {layers}; the store's run.json has {whole.aux_layers}")
    ids = [whole.layer_ids[whole.aux_layers.index(x)] for x in layers]
    return SGLangLayers(list(layers), ids, whole.convention)


def export_draft(
    checkpoint: Path,
    run_dir: Path,
    model_dir: Path,
    out_dir: Path,
    *,
    speculative_tokens: int = 3,
    progress: ProgressFn = no_progress,
) -> ExportResult:
    """Write the SGLang draft directory (and its speculators copy) for a training checkpoint.

    checkpoint: a step directory, or a checkpoints root / training out_dir (its latest complete step).
    run_dir: the store the draft was trained on (run.json: aux layers). model_dir: the target model.
    speculative_tokens: the chain length written into the speculators config and the serve arguments."""
    try:
        ckpt = resolve_checkpoint(Path(checkpoint))
    except CheckpointError as e:
        raise ExportError(str(e)) from None
    run_dir, model_dir, out_dir = Path(run_dir), Path(model_dir), Path(out_dir)
    counter = ProgressCounter("export", total=3, report=progress, every_s=0.0)  # load+check, SGLang dir, speculators
    info = RunStore(run_dir).require_run_info("export needs the store the draft was trained on")
    target_cfg = read_json(model_dir / "config.json")
    _check_same_target(info, target_cfg, run_dir, model_dir)
    try:
        method, draft_layers = checkpoint_method(ckpt)
    except CheckpointError as e:
        raise ExportError(str(e)) from None
    _check_served_tap(info, target_cfg, run_dir, method)
    model_type = str(target_cfg.get("model_type", ""))
    if method.capture == "eagle3":
        layers = served_layer_ids(info, model_type, draft_layers)
    else:  # a block drafter's ids are dflash_config.target_layer_ids, by the family's DFlash rule
        aux = list(draft_layers or info.aux_layers)
        layers = SGLangLayers(aux, target_layer_ids(aux, model_type), "dflash_target_layer_ids")

    ckpt_sha = sha256_file(ckpt / WEIGHTS)
    key = _export_key(
        ckpt_sha,
        sha256_file(model_dir / "config.json"),
        [info.aux_layers, layers.aux_layers, layers.layer_ids],
        method.name,
        speculative_tokens,
        [model_dir.resolve(), out_dir.resolve()],
    )
    prev = _previous(out_dir, key)
    if prev is not None:
        counter.add(3, skipped=3)
        return prev.model_copy(update={"skipped": True})

    cfg, tensors = _draft_tensors(ckpt, len(layers.aux_layers), target_cfg, method)
    counter.add()

    state = read_state(ckpt) if (ckpt / STATE).is_file() else {}
    model_sha = model_fingerprint(model_dir)
    notes = []
    if model_sha != info.model_sha256:
        notes.append(
            f"{model_dir} fingerprints as {model_sha[:12]}..., run.json recorded {info.model_sha256[:12]}... at "
            "extraction: serve the draft with the model it was trained on"
        )
    sglang_config = method.sglang_config(cfg, layers.layer_ids, train=checkpoint_train(ckpt))
    serve_args = ["--model-path", str(model_dir.resolve()), "--speculative-algorithm", method.algorithm,
                  "--speculative-draft-model-path", str(out_dir.resolve()),
                  *method.serve_flags(checkpoint_train(ckpt), speculative_tokens)]  # fmt: skip
    meta = {"format": EXPORT_FORMAT, "checkpoint_sha256": ckpt_sha}
    sglang_bytes = save(tensors, metadata=meta)
    spec_config = method.speculators_config(
        cfg,
        list(layers.aux_layers),  # vLLM's "input of layer k" is HF index k
        verifier=str(model_dir.resolve()),
        verifier_architectures=list(target_cfg.get("architectures") or []),
        speculative_tokens=speculative_tokens,
    )
    spec_bytes = save({method.speculators_key(k): v for k, v in tensors.items()}, metadata=meta) if spec_config else b""
    if spec_config is None:
        notes.append(f"no speculators copy: {method.speculators_note}")
    spec_ids = list(layers.aux_layers)
    result = ExportResult(
        key=key,
        out_dir=str(out_dir),
        checkpoint=str(ckpt),
        checkpoint_step=state.get("step"),
        checkpoint_sha256=ckpt_sha,
        method=method.name,
        speculative_algorithm=method.algorithm,
        run_dir=str(run_dir),
        model_dir=str(model_dir),
        model_sha256=model_sha,
        run_model_sha256=info.model_sha256,
        aux_layers=list(layers.aux_layers),
        sglang_layer_ids=layers.layer_ids,
        sglang_layer_convention=layers.convention,
        speculators_layer_ids=spec_ids,
        draft_vocab_size=cfg.draft_vocab_size,
        target_vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        num_parameters=sum(v.numel() for k, v in tensors.items() if v.is_floating_point()),
        weights_bytes=len(sglang_bytes),
        speculators_weights_bytes=len(spec_bytes),
        sglang_args=serve_args,
        notes=notes,
    )

    def write(tmp: Path) -> None:
        atomic_write_json(tmp / "config.json", sglang_config)
        atomic_write_bytes(tmp / WEIGHTS, sglang_bytes)
        counter.add()
        if spec_config is not None:
            atomic_write_json(tmp / SPECULATORS_DIR / "config.json", spec_config)
            atomic_write_bytes(tmp / SPECULATORS_DIR / WEIGHTS, spec_bytes)
        atomic_write_json(tmp / EXPORT_FILE, result.model_dump(mode="json"))

    _build_and_swap_in(out_dir, write)
    counter.add()
    return result


def _check_served_tap(info: RunInfo, target_cfg: dict[str, Any], run_dir: Path, method: DraftMethod) -> None:
    """The states SGLang will feed the draft are the ones it was trained on: refuse a target SGLang feeds something
    else through the method's capture (eagle3/target/families.py: EAGLE-3's rule and `tap`, or the block drafters'
    DFlash capture), and a store that recorded another tap than the residual stream."""
    override = info.config.get("extract", {}).get("sglang_layer_ids")
    problem = eagle3_serving_problem(target_cfg, override) if method.capture == "eagle3" else block_drafter_problem(
        target_cfg
    )
    if problem:
        raise ExportError(f"{problem}. The store {run_dir} cannot give SGLang a draft (train.method {method.name})")
    if info.tap != RESIDUAL:
        raise ExportError(
            f"{run_dir}/run.json: the store holds the {info.tap!r} tap ({TAPS.get(info.tap, '?')}); SGLang's "
            "drafts are fed the residual stream of the families this pipeline exports"
        )


def _check_same_target(info: RunInfo, target_cfg: dict[str, Any], run_dir: Path, model_dir: Path) -> None:
    try:
        t = model_facts(target_cfg, model_dir / "config.json")
    except ModelError as e:
        raise ExportError(str(e)) from None
    if (t.hidden_size, t.vocab_size, t.num_layers) != (info.hidden_size, info.vocab_size, info.num_layers):
        raise ExportError(
            f"{run_dir}/run.json (hidden {info.hidden_size}, vocab {info.vocab_size}, {info.num_layers} layers) vs "
            f"{model_dir}/config.json (hidden {t.hidden_size}, vocab {t.vocab_size}, {t.num_layers} layers): the "
            "store was extracted from another model"
        )


def _draft_tensors(
    ckpt: Path, num_aux: int, target_cfg: dict[str, Any], method: DraftMethod
) -> tuple[DraftConfig, dict[str, torch.Tensor]]:
    """The checkpoint's weights, checked against the draft they must describe, as served: floats in bf16."""
    weights = load_file(str(ckpt / WEIGHTS))
    d2t = weights.get("d2t")
    if d2t is None:
        raise ExportError(f"{ckpt}/{WEIGHTS}: no d2t (draft vocab map); was it written by eagle3's trainer?")
    cfg = DraftConfig.from_target(target_cfg, num_aux=num_aux, draft_vocab_size=len(d2t))
    _check_weights(ckpt / WEIGHTS, weights, cfg, method, checkpoint_train(ckpt))
    tensors = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in sorted(weights.items())}
    tensors["d2t"], tensors["t2d"] = weights["d2t"].to(torch.int64), weights["t2d"].to(torch.bool)
    return cfg, tensors


def _build_and_swap_in(out_dir: Path, write: Callable[[Path], None]) -> None:
    """`write` fills a temporary sibling of out_dir, which is fsynced and swapped in: a reader sees the old
    directory or the new one, never half of one."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    for stale in [*out_dir.parent.glob(f".{out_dir.name}.tmp-*"), *out_dir.parent.glob(f".{out_dir.name}.old-*")]:
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.tmp-"))
    tmp.chmod(0o755)  # mkdtemp's 0700 would hide the draft from a server run by another user
    try:
        write(tmp)
        fsync_dir(tmp)
        _swap_in(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
