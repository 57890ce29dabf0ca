"""The exported draft in real SGLang 0.5.23 on CPU, at the loader.

SGLang's own `get_model` (draft mode) loads the export in SGLang's interpreter (sglang_load_draft.py) and every
weight it holds is compared with ours, with the vocab map, the RoPE it built from config.json, and the layers
the target then captures; SGLang's draft forward is compared with our training forward. Stock SGLang 0.5.23
(no plugin) cannot serve EAGLE3 on this CPU (docs/sglang.md); with our plugin's EAGLE3_CPU_SPEC=1 it can, and
tests/integration/test_live_sglang_cpu.py serves the export live. The live evaluation's request/response path
is run here against the real plain server.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from eagle3.config import EvaluateConfig
from eagle3.draft.eagle3.model import Eagle3Draft
from eagle3.draft.layers import apply_rope, dense_attend, rope_cos_sin, rope_inv_freq
from eagle3.draft.shape import DraftConfig
from eagle3.evaluate.live import LiveEvalError, measure
from eagle3.release.export import ExportResult
from eagle3.serving.server import SGLangServer
from tests.integration.sglang_support import AUX, export_random_draft, require_sglang_env, sglang_view

pytestmark = pytest.mark.sglang
HERE = Path(__file__).resolve().parent
DRAFT_VOCAB = 4096


@pytest.fixture(scope="module")
def exported(demo_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[ExportResult, dict[str, Any]]:
    """A draft with random weights (norms too) and a random vocab map, exported for SmolLM2."""
    require_sglang_env()
    root = tmp_path_factory.mktemp("export")
    result, cfg = export_random_draft(demo_model, root, DRAFT_VOCAB)

    g = torch.Generator().manual_seed(1)  # step-0 inputs: target ids and fused aux states [T, K*H]
    inputs = {"input_ids": torch.randint(0, cfg.vocab_size, (48,), generator=g),
              "aux": torch.randn(48, 3 * cfg.target_hidden_size, generator=g).to(torch.bfloat16)}  # fmt: skip
    view = sglang_view(result.out_dir, demo_model, root, inputs)
    return result, {**view, "inputs": inputs}


def test_sglang_loads_every_weight_of_the_export_as_we_wrote_it(exported: tuple[ExportResult, dict[str, Any]]) -> None:
    result, view = exported
    assert view["meta"]["class"] == "LlamaForCausalLMEagle3"
    ours = load_file(str(Path(result.out_dir) / "model.safetensors"))
    got = {k.removeprefix("param."): v for k, v in view["tensors"].items() if k.startswith("param.")}
    layer = "model.layers.0."
    expected = {
        "model.fc.weight": ours["fc.weight"],
        "lm_head.weight": ours["lm_head.weight"],
        "model.norm.weight": ours["norm.weight"],
        layer + "self_attn.qkv_proj.weight": torch.cat(
            [ours[f"midlayer.self_attn.{x}_proj.weight"] for x in "qkv"]
        ),  # SGLang fuses q/k/v on load
        layer + "self_attn.o_proj.weight": ours["midlayer.self_attn.o_proj.weight"],
        layer + "mlp.gate_up_proj.weight": torch.cat(
            [ours["midlayer.mlp.gate_proj.weight"], ours["midlayer.mlp.up_proj.weight"]]
        ),
        layer + "mlp.down_proj.weight": ours["midlayer.mlp.down_proj.weight"],
        layer + "hidden_norm.weight": ours["midlayer.hidden_norm.weight"],
        layer + "input_layernorm.weight": ours["midlayer.input_layernorm.weight"],
        layer + "post_attention_layernorm.weight": ours["midlayer.post_attention_layernorm.weight"],
    }
    # the embedding is the only parameter not from the export: the EAGLE worker replaces it with the target's
    assert set(got) == {*expected, "model.embed_tokens.weight"}
    for name, want in expected.items():
        assert got[name].dtype == torch.bfloat16 and torch.equal(got[name], want), name
    hot = view["tensors"]["hot_token_id"]  # draft id -> target id, what SGLang maps its draft tokens through
    assert torch.equal(hot, torch.arange(DRAFT_VOCAB) + ours["d2t"])


def test_sglang_reads_our_layer_ids_so_the_target_captures_the_runs_aux_layers(
    exported: tuple[ExportResult, dict[str, Any]],
) -> None:
    result, view = exported
    assert view["meta"]["draft_layer_ids"] == result.sglang_layer_ids == [1, 14, 26]
    assert view["meta"]["target_layers_to_capture"] == AUX  # HF hidden_states indices, as the draft was trained


def test_sglangs_draft_rope_is_the_one_we_trained_with(
    exported: tuple[ExportResult, dict[str, Any]], demo_model: Path
) -> None:
    _, view = exported
    cfg = DraftConfig.from_target(json.loads((demo_model / "config.json").read_text()), num_aux=3, draft_vocab_size=1)
    t = view["tensors"]
    assert view["meta"]["rope_theta"] == cfg.rope_theta

    def max_error(theta: float) -> float:
        inv_freq = rope_inv_freq(dataclasses.replace(cfg, rope_theta=theta))
        cos, sin = rope_cos_sin(inv_freq, torch.arange(64))
        q = apply_rope(t["rope.q"].view(64, cfg.num_heads, cfg.head_dim), cos, sin).reshape(64, -1)
        k = apply_rope(t["rope.k"].view(64, cfg.num_kv_heads, cfg.head_dim), cos, sin).reshape(64, -1)
        return max(float((t["rope.q_rot"] - q).abs().max()), float((t["rope.k_rot"] - k).abs().max()))

    # SGLang keeps its cos/sin cache in bf16 (~0.01 off here); a neighbouring theta is off by far more
    assert max_error(cfg.rope_theta) < 0.03
    assert max_error(cfg.rope_theta / 10) > 0.5
    assert not torch.allclose(t["rope.q_rot"], t["rope.q"], atol=1e-2)  # positions > 0 did rotate


def token_errors(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a - b).norm(dim=-1) / b.norm(dim=-1)


def test_sglangs_draft_forward_matches_our_training_forward(
    exported: tuple[ExportResult, dict[str, Any]], demo_model: Path
) -> None:
    """Step 0 of the draft on the same ids and aux states: SGLang's model code (its fc, norms, fused qkv, RoPE,
    o_proj, MLP, final norm; a plain causal SDPA for its attention backend) vs our training forward in fp32."""
    result, view = exported
    cfg = DraftConfig.from_target(json.loads((demo_model / "config.json").read_text()), num_aux=3,
                                  draft_vocab_size=DRAFT_VOCAB)  # fmt: skip
    embed = load_file(str(demo_model / "model.safetensors"))["model.embed_tokens.weight"]
    draft = Eagle3Draft(cfg, embed.float())
    weights = load_file(str(Path(result.out_dir) / "model.safetensors"))
    draft.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in weights.items()}, strict=False)
    ids, aux = view["inputs"]["input_ids"], view["inputs"]["aux"].float()

    def ours(aux: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            cos, sin = rope_cos_sin(draft.inv_freq, torch.arange(len(ids)))
            one_doc = dense_attend(torch.zeros(len(ids), dtype=torch.long))
            h = draft.midlayer(draft.embed_tokens(ids), draft.fc(aux), cos, sin, [], one_doc)
            return draft.lm_head(draft.norm(h))

    sglang = view["tensors"]["step0.logits"]
    assert float(token_errors(sglang, ours(aux)).max()) < 0.03  # bf16 serving vs fp32: ~0.008 measured
    k = cfg.target_hidden_size  # the aux layers in the wrong order: far off, so the check can tell
    swapped = torch.cat([aux[:, 2 * k :], aux[:, k : 2 * k], aux[:, :k]], dim=1)
    assert float(token_errors(sglang, ours(swapped)).median()) > 0.5


def test_stock_sglang_cannot_serve_eagle3_on_this_cpu_for_want_of_a_draft_attention_backend(
    exported: tuple[ExportResult, dict[str, Any]],
) -> None:
    errors = exported[1]["meta"]["backend_errors"]
    assert all(e is not None and "EAGLE is not supported in" in e for e in errors.values()), (
        f"stock SGLang now builds EAGLE3 draft attention backends on CPU ({errors}): the plugin's fallback "
        "(server_patch/cpu_spec.py, EAGLE3_CPU_SPEC) may no longer be needed; see docs/sglang.md"
    )


def test_the_live_measurement_runs_against_the_real_plain_server(
    demo_tokenizer: Any, plain_server: SGLangServer
) -> None:
    texts = [
        demo_tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
        for q in ("What is the capital of France?", "Name three colours.")
    ]
    prompts = [demo_tokenizer(t, add_special_tokens=False).input_ids for t in texts]
    run, outputs = measure(plain_server.url, prompts, label="plain", max_new_tokens=12)  # the session's server
    with pytest.raises(LiveEvalError, match="not speculating"):
        measure(plain_server.url, prompts[:1], label="eagle3", max_new_tokens=4)
    assert [p.prompt_tokens for p in run.prompts] == [len(p) for p in prompts]
    assert all(0 < p.completion_tokens <= 12 for p in run.prompts) and run.tokens_per_s > 0.5
    assert "Paris" in demo_tokenizer.decode(outputs[0])  # greedy SmolLM2 answers it
    assert run.accept_length is None and EvaluateConfig().live == "auto"
