"""A peer's trained draft read into a checkpoint directory of ours: key names, dropped verifier tensors, refusals.

(speculators' real trainer writing the directory: tests/integration/test_peer_speculators.py.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from eagle3.convert import PeerFormatError, import_sglang_draft, import_speculators_draft

H, VD, V = 8, 4, 16
LAYER = {"self_attn.q_proj.weight": (H, 2 * H), "mlp.down_proj.weight": (H, 2 * H), "hidden_norm.weight": (H,)}


def _weights(prefix: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    w = {prefix + k: torch.randn(s, generator=g).to(torch.bfloat16) for k, s in LAYER.items()}
    w.update({"fc.weight": torch.randn(H, 3 * H, generator=g).to(torch.bfloat16),
              "norm.weight": torch.ones(H, dtype=torch.bfloat16),
              "lm_head.weight": torch.randn(VD, H, generator=g).to(torch.bfloat16),
              "d2t": torch.tensor([0, 1, 3, 5]), "t2d": torch.zeros(V, dtype=torch.bool)})  # fmt: skip
    return w


def _speculators_dir(path: Path, **flags: object) -> dict[str, torch.Tensor]:
    path.mkdir(parents=True)
    w = {**_weights("layers.0."), "embed_tokens.weight": torch.randn(V, H).to(torch.bfloat16)}
    save_file(w, str(path / "model.safetensors"))
    cfg = {"speculators_model_type": "eagle3", "transformer_layer_config": {"num_hidden_layers": 1},
           "eagle_aux_hidden_state_layer_ids": [2, 15, 27], "norm_before_residual": False, "norm_before_fc": False,
           "fc_norm": False, "norm_output": False, "embed_requires_grad": False, **flags}  # fmt: skip
    (path / "config.json").write_text(json.dumps(cfg))
    return w


def test_a_speculators_draft_comes_in_under_our_key_names_in_fp32_without_the_verifiers_embedding(
    tmp_path: Path,
) -> None:
    theirs = _speculators_dir(tmp_path / "theirs")
    got = import_speculators_draft(tmp_path / "theirs", tmp_path / "ours")
    assert got.aux_layers == [2, 15, 27] and got.dropped == ["embed_tokens.weight"] and got.draft_vocab_size == VD
    ours = load_file(str(tmp_path / "ours" / "model.safetensors"))
    assert set(ours) == {"midlayer." + k for k in LAYER} | {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"}
    for key, value in theirs.items():
        if key != "embed_tokens.weight":
            mine = ours["midlayer." + key.removeprefix("layers.0.") if key.startswith("layers.0.") else key]
            assert torch.equal(mine.to(value.dtype), value) and (mine.dtype == torch.float32 or key in ("d2t", "t2d"))
    state = json.loads((tmp_path / "ours" / "state.json").read_text())
    assert state["method"] == "eagle3" and state["aux_layers"] == [2, 15, 27]


@pytest.mark.parametrize("flag", ["norm_before_residual", "fc_norm", "norm_output", "embed_requires_grad"])
def test_a_speculators_draft_built_otherwise_is_refused_by_name(tmp_path: Path, flag: str) -> None:
    _speculators_dir(tmp_path / "theirs", **{flag: True})
    with pytest.raises(PeerFormatError, match=flag):
        import_speculators_draft(tmp_path / "theirs", tmp_path / "ours")


def test_an_sglang_draft_directory_comes_in_as_it_is_and_its_layer_count_is_checked(tmp_path: Path) -> None:
    src = tmp_path / "sglang"
    src.mkdir()
    save_file(_weights("midlayer."), str(src / "model.safetensors"))
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1,
           "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 14, 26]}}  # fmt: skip
    (src / "config.json").write_text(json.dumps(cfg))
    got = import_sglang_draft(src, tmp_path / "ours", [2, 15, 27])
    assert got.aux_layers == [2, 15, 27] and got.dropped == []
    assert "midlayer.hidden_norm.weight" in load_file(str(tmp_path / "ours" / "model.safetensors"))
    with pytest.raises(PeerFormatError, match="layer ids"):
        import_sglang_draft(src, tmp_path / "again", [2, 15])
