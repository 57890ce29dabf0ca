"""An EAGLE-3.1 export (train.method eagle3.1) in real SGLang 0.5.23 on CPU, at the loader: SGLang's llama_eagle3.py
reads both flags from our config.json, loads our per-aux norms, and its step 0 equals our training forward with
them (and differs without them); with norm_output the state it hands the next step is the post-norm one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from eagle3.draft.eagle3.model import Eagle3Draft, Eagle3Flags
from eagle3.draft.layers import dense_attend, rope_cos_sin
from eagle3.release.export import ExportResult
from tests.integration.sglang_support import export_random_draft, require_sglang_env, sglang_view

pytestmark = pytest.mark.sglang
DRAFT_VOCAB = 2048


@pytest.fixture(scope="module")
def exported(demo_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[ExportResult, dict[str, Any]]:
    require_sglang_env()
    root = tmp_path_factory.mktemp("export-eagle3.1")
    result, cfg = export_random_draft(demo_model, root, DRAFT_VOCAB, method="eagle3.1")
    g = torch.Generator().manual_seed(2)  # per-aux scales far from 1, so a missing norm shows
    aux = torch.cat([torch.randn(32, cfg.target_hidden_size, generator=g) * s for s in (0.1, 3.0, 30.0)], dim=1)
    inputs = {"input_ids": torch.randint(0, cfg.vocab_size, (32,), generator=g), "aux": aux.to(torch.bfloat16)}
    return result, {**sglang_view(result.out_dir, demo_model, root, inputs), "inputs": inputs, "cfg": cfg}


def test_the_export_names_the_method_and_sets_both_flags_where_sglang_reads_them(
    exported: tuple[ExportResult, dict[str, Any]],
) -> None:
    result, view = exported
    config = json.loads((Path(result.out_dir) / "config.json").read_text())
    assert (config["fc_norm"], config["norm_output"], result.method) == (True, True, "eagle3.1")
    ours = load_file(str(Path(result.out_dir) / "model.safetensors"))
    got = {k.removeprefix("param."): v for k, v in view["tensors"].items() if k.startswith("param.")}
    norms = sorted(k for k in got if "fc_norm" in k)
    assert norms == [f"model.fc_norm.{i}.weight" for i in range(3)]
    for i in range(3):
        assert torch.equal(got[f"model.fc_norm.{i}.weight"], ours[f"fc_norm.{i}.weight"])


def test_sglangs_step0_is_our_forward_with_the_per_aux_norms_and_hands_on_the_post_norm_state(
    exported: tuple[ExportResult, dict[str, Any]], demo_model: Path
) -> None:
    result, view = exported
    embed = load_file(str(demo_model / "model.safetensors"))["model.embed_tokens.weight"].float()
    weights = load_file(str(Path(result.out_dir) / "model.safetensors"))
    ids, aux = view["inputs"]["input_ids"], view["inputs"]["aux"].float()
    k = view["cfg"].num_aux

    def ours(flags: Eagle3Flags) -> tuple[torch.Tensor, torch.Tensor]:
        draft = Eagle3Draft(view["cfg"], embed, flags)
        draft.load_state_dict({n: v.float() for n, v in weights.items() if n in draft.state_dict()}, strict=False)
        with torch.no_grad():
            states = aux.view(len(ids), k, -1)
            if draft.fc_norm is not None:
                states = torch.stack([norm(states[:, j]) for j, norm in enumerate(draft.fc_norm)], dim=1)
            cos, sin = rope_cos_sin(draft.inv_freq, torch.arange(len(ids)))
            h = draft.midlayer(draft.embed_tokens(ids), draft.fc(states.reshape(len(ids), -1)), cos, sin, [],
                               dense_attend(torch.zeros(len(ids), dtype=torch.long)))  # fmt: skip
            return draft.lm_head(draft.norm(h)), draft.norm(h)

    def err(a: torch.Tensor, b: torch.Tensor) -> float:
        return float(((a - b).norm(dim=-1) / b.norm(dim=-1)).max())

    logits, normed = ours(Eagle3Flags(fc_norm=True, norm_output=True))
    sglang = view["tensors"]
    assert err(sglang["step0.logits"], logits) < 0.03  # bf16 serving vs fp32
    assert err(sglang["step0.hidden"], normed) < 0.03  # norm_output: the post-norm state goes to the next step
    no_norm, _ = ours(Eagle3Flags())
    assert err(sglang["step0.logits"], no_norm) > 0.3  # the norms matter on these states: the check can tell
