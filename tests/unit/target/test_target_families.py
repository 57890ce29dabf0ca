"""The target families table (eagle3/target/families.py): one row per architecture, and what reads it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import transformers

from eagle3.draft.shape import MLA_DRAFT_HEAD_DIM, DraftConfig
from eagle3.serving.layers import LayerMappingError, internal_indices, sglang_layer_ids, sglang_rule
from eagle3.target.families import (
    BLOCK_DRAFTER_ARCHITECTURES,
    FAMILIES,
    MODEL_TYPES,
    REFUSED_ARCHITECTURES,
    SGLANG_RULES,
    TAPS,
    TESTED_ARCHITECTURES,
    TINY_ARCHITECTURES,
    family_named,
    family_of,
    servable,
)
from eagle3.target.files import ModelError, layer_count
from eagle3.target.install import installing
from eagle3.target.layout import HEAD_KEYS, LM_PREFIXES, text_config
from eagle3.target.tiny import ARCHITECTURES, VOCAB, config_json, tiny_config

WITH_RECIPE = [f for f in FAMILIES if f.tiny is not None]


def test_every_row_names_a_known_sglang_rule_and_attention_and_each_key_is_in_one_row() -> None:
    for family in FAMILIES:
        assert family.sglang_rule in (*SGLANG_RULES, None) and family.attention in ("gqa", "mla", None), family
        assert family.tap in TAPS and all(tap in TAPS for _, tap in family.tap_when), family
        assert family.sglang_rule or family.dflash_rule, f"{family}: a row SGLang captures for no draft"
        assert family.model_types and all(family_of(t) is family for t in family.model_types)
        assert family_named(family.architecture) is family
    assert len(set(MODEL_TYPES)) == len(MODEL_TYPES)
    assert len({f.architecture for f in FAMILIES}) == len(FAMILIES)
    assert family_of("falcon") is None and family_named("FalconForCausalLM") is None


def test_the_tested_architectures_are_the_rows_with_a_recipe() -> None:
    assert TESTED_ARCHITECTURES == ARCHITECTURES == tuple(f.architecture for f in WITH_RECIPE if servable(f))
    assert TESTED_ARCHITECTURES == (
        "LlamaForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "DeepseekV3ForCausalLM", "GptOssForCausalLM",
        "MistralForCausalLM", "Phi3ForCausalLM", "Llama4ForCausalLM", "Llama4ForConditionalGeneration",
        "ApertusForCausalLM", "Qwen2ForCausalLM", "Qwen2_5_VLForConditionalGeneration", "Qwen2MoeForCausalLM",
        "Qwen3NextForCausalLM", "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM", "Qwen3_5ForConditionalGeneration",
        "Qwen3_5MoeForConditionalGeneration", "Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration",
        "ExaoneMoeForCausalLM", "Glm4MoeForCausalLM", "Gemma4ForCausalLM", "Gemma4ForConditionalGeneration",
        "LongcatFlashForCausalLM", "MiniMaxM2ForCausalLM", "MiniMaxM3SparseForConditionalGeneration",
        "DeepseekV2ForCausalLM", "DeepseekV32ForCausalLM",
        "KimiK25ForConditionalGeneration", "GlmMoeDsaForCausalLM", "Glm4MoeLiteForCausalLM",
    )  # fmt: skip
    assert REFUSED_ARCHITECTURES == ("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration")  # to prove refusals on
    assert BLOCK_DRAFTER_ARCHITECTURES == (
        "LagunaForCausalLM", "Lfm2ForCausalLM", "Lfm2MoeForCausalLM", "MiMoV2FlashForCausalLM", "NemotronHForCausalLM",
    )  # fmt: skip
    assert set(TINY_ARCHITECTURES) == {*TESTED_ARCHITECTURES, *REFUSED_ARCHITECTURES, *BLOCK_DRAFTER_ARCHITECTURES}


@pytest.mark.parametrize("family", WITH_RECIPE, ids=lambda f: f.architecture)
def test_every_recipe_builds_a_transformers_config_of_its_rows_model_type(family: Any) -> None:
    assert hasattr(transformers, family.tiny.config_class)
    cfg = tiny_config(family.architecture)
    assert cfg.model_type in family.model_types and cfg.architectures == [family.architecture]
    saved = config_json(family.architecture, cfg.to_dict())  # what config.json will say
    text = text_config(saved)  # a wrapper's language model
    assert text["vocab_size"] == VOCAB and layer_count(saved, text) == 8  # decoder layers, as SGLang counts them
    # the row's attention is what probing the config would say: the draft is the same as before the table
    assert family.attention == ("mla" if text.get("kv_lora_rank") else "gqa")
    assert (family.tiny.wrapper is not None) == ("text_config" in saved), "a wrapper's recipe says `wrapper`"


def test_a_name_without_a_recipe_is_a_model_error_naming_the_known_ones() -> None:
    for name in ("FalconForCausalLM", "InternLM3ForCausalLM"):  # no row; a row with no recipe
        with pytest.raises(ModelError, match=r"no tiny recipe.*LlamaForCausalLM"):
            tiny_config(name)


@pytest.mark.parametrize("model_type", [t for t in MODEL_TYPES if sglang_rule(t)])
def test_every_model_type_has_its_rows_sglang_rule(model_type: str) -> None:
    family = family_of(model_type)
    assert family is not None and sglang_rule(model_type) == family.sglang_rule
    m = sglang_layer_ids(model_type, [2, 15, 27], 30)
    assert internal_indices(model_type, m.layer_ids, 30) == [2, 15, 27]
    assert sglang_rule("falcon") is None


def test_text_config_is_a_wrappers_language_model_or_the_config_itself() -> None:
    text = {"hidden_size": 64, "model_type": "deepseek_v3"}
    assert text_config({"model_type": "kimi_k25", "text_config": text}) is text
    plain = {"hidden_size": 64, "model_type": "llama"}
    assert text_config(plain) is plain


def test_the_language_model_layouts_are_tried_causal_lm_first() -> None:
    assert LM_PREFIXES == ("model.", "language_model.model.", "model.language_model.", "backbone.")
    assert HEAD_KEYS == ("lm_head.weight", "language_model.lm_head.weight")


GQA_SHAPED = {"hidden_size": 256, "intermediate_size": 64, "num_attention_heads": 8, "num_key_value_heads": 2,
              "vocab_size": 100, "hidden_act": "silu"}  # fmt: skip


def draft_heads(target: dict[str, Any]) -> tuple[int, int, int]:
    cfg = DraftConfig.from_target(target, num_aux=3, draft_vocab_size=40)
    return cfg.num_heads, cfg.num_kv_heads, cfg.head_dim


def test_the_drafts_attention_comes_from_the_row_and_from_a_probe_only_without_one() -> None:
    mla = (256 // MLA_DRAFT_HEAD_DIM, 256 // MLA_DRAFT_HEAD_DIM, MLA_DRAFT_HEAD_DIM)
    assert draft_heads({**GQA_SHAPED, "model_type": "llama"}) == (8, 2, 32)
    assert draft_heads({**GQA_SHAPED, "model_type": "deepseek_v2"}) == mla  # the row says MLA
    wrapped = {"model_type": "kimi_k25", "text_config": {**GQA_SHAPED, "kv_lora_rank": 16}}
    assert draft_heads(wrapped) == mla
    assert draft_heads({**GQA_SHAPED, "model_type": "falcon", "kv_lora_rank": 16}) == mla  # no row: the probe
    assert draft_heads({**GQA_SHAPED}) == (8, 2, 32)


def test_an_install_appears_whole_or_leaves_the_previous_one(tmp_path: Path) -> None:
    target = tmp_path / "models" / "m"
    with installing(target) as tmp:
        (tmp / "config.json").write_text("{}")
    assert [p.name for p in target.iterdir()] == ["config.json"]
    with pytest.raises(OSError, match="disk full"), installing(target) as tmp:
        (tmp / "half").write_text("x")
        raise OSError("disk full")
    assert [p.name for p in target.iterdir()] == ["config.json"]
    assert [p.name for p in target.parent.iterdir()] == ["m"]  # no temporary directory left


def test_a_config_flag_that_changes_the_tap_is_read_from_the_language_models_config() -> None:
    glm5 = family_named("Glm5NextForConditionalGeneration")
    assert glm5 is not None
    assert glm5.tap_of(text_config({"text_config": {"mhc": False}})) == "residual"
    assert glm5.tap_of(text_config({"text_config": {"mhc": True, "hc_mult": 4}})) == "hyper_connections"
    gemma = family_of("gemma3_text")
    assert gemma is not None and gemma.tap_of({}) == "gemma3"


def test_a_family_sglang_captures_for_block_drafters_only_has_no_eagle3_ids() -> None:
    with pytest.raises(LayerMappingError, match=r"LagunaForCausalLM.*block drafters only.*laguna.py"):
        sglang_layer_ids("laguna", [2, 15, 27], 30)


def test_docs_models_prints_every_row_with_its_rule_and_tap() -> None:
    text = (Path(__file__).resolve().parents[3] / "docs" / "models.md").read_text()
    table = text.partition("## What SGLang feeds the draft, per family")[2].partition("\n## ")[0]
    for f in FAMILIES:
        line = next((ln for ln in table.splitlines() if ln.startswith(f"| {f.architecture} |")), None)
        assert line is not None, f"docs/models.md has no row for {f.architecture}: print FAMILIES again"
        assert f" {f.sglang_rule or '-'} | {f.dflash_rule or '-'} | {f.tap}" in line, line


def test_a_recipes_config_is_the_same_whatever_was_built_before_it_in_the_process() -> None:
    """Config classes change the dicts they are given (Phi-3's rope_parameters gains partial_rotary_factor, Gemma's
    a dict per layer type): a tiny target must not depend on which family the same process built before it."""
    alone = {arch: tiny_config(arch).to_dict() for arch in reversed(ARCHITECTURES)}
    for arch in ARCHITECTURES:
        assert tiny_config(arch).to_dict() == alone[arch], arch
