"""HF hidden_states indices -> SGLang --return-aux-hidden-state-layer-ids, per model family."""

from __future__ import annotations

import pytest

from eagle3.serving.layers import LayerMappingError, internal_indices, sglang_layer_ids


@pytest.mark.parametrize("model_type", ["llama", "qwen3", "mistral", "gpt_oss"])
def test_plus_one_families_pass_index_minus_one_and_sglang_maps_back(model_type: str) -> None:
    m = sglang_layer_ids(model_type, [2, 15, 27], 30)
    assert m.layer_ids == [1, 14, 26]
    assert m.cli_args() == ["--return-aux-hidden-state-layer-ids", "1", "14", "26"]
    assert internal_indices(model_type, m.layer_ids, 30) == [2, 15, 27]


def test_deepseek_and_kimi_pass_indices_as_is_because_the_first_id_is_not_1() -> None:
    for model_type in ("deepseek_v3", "kimi_k2", "kimi_k25"):
        m = sglang_layer_ids(model_type, [3, 31, 59], 61)
        assert m.layer_ids == [3, 31, 59]
        assert internal_indices(model_type, m.layer_ids, 61) == [3, 31, 59]
    assert internal_indices("deepseek_v3", [1, 30, 58], 61) == [2, 31, 59]  # SpecForge-style output ids


def test_deepseek_cannot_express_hf_index_1() -> None:
    with pytest.raises(LayerMappingError, match="HF index 1 cannot be requested"):
        sglang_layer_ids("deepseek_v3", [1, 30, 58], 61)


def test_the_last_layer_output_and_the_embeddings_are_refused() -> None:
    with pytest.raises(LayerMappingError, match=r"\[30\] cannot be captured"):
        sglang_layer_ids("llama", [2, 15, 30], 30)
    with pytest.raises(LayerMappingError, match=r"\[0\]"):
        sglang_layer_ids("llama", [0, 15], 30)


def test_an_unknown_family_is_an_error_that_says_what_to_do() -> None:
    with pytest.raises(LayerMappingError, match=r"no SGLang layer-id rule.*FAMILIES"):
        sglang_layer_ids("falcon", [2, 15, 27], 30)


def test_the_convention_string_names_the_family_and_the_rule() -> None:
    m = sglang_layer_ids("llama", [2, 15, 27], 30)
    assert "llama" in m.convention and "id + 1" in m.convention


def test_an_unknown_family_can_be_given_its_ids_which_the_hook_then_checks() -> None:
    m = sglang_layer_ids("falcon", [2, 15, 27], 30, override=[1, 14, 26])
    assert m.layer_ids == [1, 14, 26] and m.aux_layers == [2, 15, 27] and "extract.sglang_layer_ids" in m.convention
    with pytest.raises(LayerMappingError, match="as many layers"):
        sglang_layer_ids("falcon", [2, 15, 27], 30, override=[1, 14])
