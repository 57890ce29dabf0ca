"""A peer's trained EAGLE-3 draft, read into a checkpoint directory our evaluator, export and warm start load.

    import_speculators_draft(src_dir, out_dir) -> DraftImport   speculators' save_pretrained directory
    import_sglang_draft(src_dir, out_dir, aux_layers)            an SGLang draft directory (SpecForge's
                                                                `specforge export --to sglang`, or ours)

What speculators 0.9.0 writes (speculators/models/eagle3/core.py, Eagle3DraftModel.save_pretrained):

    <src>/config.json          Eagle3SpeculatorConfig: transformer_layer_config, draft_vocab_size,
                               eagle_aux_hidden_state_layer_ids (vLLM ids: input of layer k = HF index k),
                               norm_before_residual, norm_before_fc, fc_norm, norm_output, embed_requires_grad
    <src>/model.safetensors    fc.weight, layers.0.* (the decoder layer), norm.weight, lm_head.weight, d2t, t2d,
                               embed_tokens.weight (the verifier's, frozen), in the training dtype

What comes out (the layout of a training step directory, eagle3/draft/checkpoint.py, without optimizer state):

    <out>/model.safetensors    the same tensors in our (SGLang's) key names, layers.0.* -> midlayer.* (the inverse
                               of speculators_key in eagle3/draft/eagle3/serving.py), floats in fp32, d2t int64,
                               t2d bool; no embedding: the draft shares the target's, reloaded from the target model
    <out>/state.json           {"method": "eagle3", "aux_layers": [...], "imported_from": {...}}

An SGLang draft directory (LlamaForCausalLMEagle3: config.json, model.safetensors in SGLang's key names = ours, no
embedding) needs no renaming; its layer ids are SGLang's (eagle3/serving/layers.py, per family), so the caller
names the store's HF layers they stand for, and only their count is checked here.

Only the draft our EAGLE-3 method builds is accepted: one layer, the first layer's residual un-normed
(norm_before_residual false), no norm before fc, no per-layer fc norms, no norm on the fed-back output, and a frozen
embedding. Any other flag names itself in the error (it would load and run as another model).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from pydantic import Field
from safetensors.torch import load_file, save

from eagle3.convert.common import PeerFormatError, Record
from eagle3.store.fsio import atomic_write_bytes, atomic_write_json, read_json

CHECKPOINT_WEIGHTS = "model.safetensors"  # the step directory's weights file (eagle3/draft/checkpoint.py WEIGHTS)
CHECKPOINT_STATE = "state.json"  # and its state, whose "method" and "aux_layers" the loader reads
#: speculators' flags whose other value builds a draft that is not our EAGLE-3 draft
_FLAGS = {"norm_before_residual": False, "norm_before_fc": False, "fc_norm": False, "norm_output": False,
          "embed_requires_grad": False}  # fmt: skip
#: tensors of a speculators checkpoint that are the verifier's, not the draft's
_VERIFIER_KEYS = ("embed_tokens.weight", "verifier_norm.weight", "verifier_lm_head.weight")


class DraftImport(Record):
    peer: str
    src_dir: str
    out_dir: str
    aux_layers: list[int] = Field(description="HF hidden_states indices the draft reads")
    draft_vocab_size: int
    num_parameters: int
    dropped: list[str] = Field(description="the verifier's tensors in the peer checkpoint, not the draft's")


def _speculators_to_ours(key: str) -> str:
    return "midlayer." + key.removeprefix("layers.0.") if key.startswith("layers.0.") else key


def _write(out: Path, tensors: dict[str, torch.Tensor], result: DraftImport) -> DraftImport:
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out / CHECKPOINT_WEIGHTS, save(tensors, metadata={"imported_from": result.src_dir}))
    state = {"method": "eagle3", "aux_layers": result.aux_layers, "imported_from": result.model_dump(mode="json")}
    atomic_write_json(out / CHECKPOINT_STATE, state)
    return result


def _draft_tensors(path: Path, weights: dict[str, torch.Tensor], rename: Any) -> dict[str, torch.Tensor]:
    missing = [k for k in ("fc.weight", "d2t", "lm_head.weight") if k not in weights]
    if missing:
        raise PeerFormatError(f"{path}: no {missing}; is it an EAGLE-3 draft?")
    tensors = {rename(k): v.float() if v.is_floating_point() else v
               for k, v in sorted(weights.items()) if k not in _VERIFIER_KEYS}  # fmt: skip
    d2t = weights["d2t"].to(torch.int64)
    if "t2d" not in weights:
        raise PeerFormatError(f"{path}: no t2d (the target -> draft map); write it beside d2t")
    tensors["d2t"], tensors["t2d"] = d2t, weights["t2d"].to(torch.bool)
    return tensors


def import_sglang_draft(src_dir: str | Path, out_dir: str | Path, aux_layers: list[int]) -> DraftImport:
    """An SGLang EAGLE-3 draft directory -> a checkpoint directory of ours; `aux_layers`: the HF indices of the store
    its eagle_aux_hidden_state_layer_ids stand for (one per id, in order)."""
    src, out = Path(src_dir), Path(out_dir)
    cfg: dict[str, Any] = read_json(src / "config.json")
    ids = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") or []
    other = {k: cfg.get(k) for k in ("fc_norm", "norm_output", "use_aux_norm") if cfg.get(k)}
    if int(cfg.get("num_hidden_layers", 1)) != 1 or other or len(ids) != len(aux_layers):
        raise PeerFormatError(f"{src / 'config.json'}: {cfg.get('num_hidden_layers')} layer(s), flags {other}, layer "
                              f"ids {ids} for aux layers {aux_layers}: not the one-layer EAGLE-3 draft our method "
                              "builds on these layers")  # fmt: skip
    files = sorted(src.glob("*.safetensors"))
    if not files:
        raise PeerFormatError(f"{src}: no *.safetensors")
    weights = {k: v for f in files for k, v in load_file(str(f)).items()}
    tensors = _draft_tensors(src, weights, lambda k: k)
    dropped = sorted(k for k in weights if k in _VERIFIER_KEYS)
    return _write(out, tensors, DraftImport(
        peer="sglang", src_dir=str(src), out_dir=str(out), aux_layers=list(aux_layers),
        draft_vocab_size=int(tensors["d2t"].numel()),
        num_parameters=sum(v.numel() for v in tensors.values() if v.is_floating_point()), dropped=dropped,
    ))  # fmt: skip


def import_speculators_draft(src_dir: str | Path, out_dir: str | Path) -> DraftImport:
    """speculators' EAGLE-3 checkpoint directory -> a checkpoint directory of ours (out_dir, created or replaced)."""
    src, out = Path(src_dir), Path(out_dir)
    cfg: dict[str, Any] = read_json(src / "config.json")
    if cfg.get("speculators_model_type") != "eagle3":
        raise PeerFormatError(f"{src / 'config.json'}: speculators_model_type {cfg.get('speculators_model_type')!r}, "
                              "not 'eagle3'")  # fmt: skip
    layers = int(cfg.get("transformer_layer_config", {}).get("num_hidden_layers", 1))
    other = {k: cfg.get(k) for k, want in _FLAGS.items() if bool(cfg.get(k) or False) != want}
    if layers != 1 or other:
        raise PeerFormatError(f"{src / 'config.json'}: {layers} decoder layer(s), flags {other}: not the one-layer "
                              f"EAGLE-3 draft our method builds (it needs {_FLAGS})")  # fmt: skip
    ids = cfg.get("eagle_aux_hidden_state_layer_ids")
    if not ids:
        raise PeerFormatError(f"{src / 'config.json'}: no eagle_aux_hidden_state_layer_ids")
    weights = load_file(str(src / CHECKPOINT_WEIGHTS))
    tensors = _draft_tensors(src / CHECKPOINT_WEIGHTS, weights, _speculators_to_ours)
    aux_layers = [int(i) for i in ids]  # vLLM's "input of layer k" is HF index k (eagle3/convert/common.py)
    return _write(out, tensors, DraftImport(
        peer="speculators", src_dir=str(src), out_dir=str(out), aux_layers=aux_layers,
        draft_vocab_size=int(tensors["d2t"].numel()),
        num_parameters=sum(v.numel() for v in tensors.values() if v.is_floating_point()),
        dropped=sorted(k for k in weights if k in _VERIFIER_KEYS),
    ))  # fmt: skip
