"""HF hidden_states indices -> the ids SGLang 0.5.23 takes in `--return-aux-hidden-state-layer-ids`.

Inside SGLang, `model.layers_to_capture = [i, ...]` captures the residual stream entering decoder layer
i, which is HF `hidden_states[i]` (checked numerically on SmolLM2, tests/integration/test_sglang_capture.py
`test_dumps_match_the_hf_forward_per_token_and_not_the_neighbouring_layers`; per tiny architecture,
tests/integration/test_architectures_sglang.py). What differs per model family is how
`set_eagle3_layers_to_capture(ids)` turns the configured ids into those internal indices (read in
sglang/srt/models/*.py, 0.5.23); each family's rule is its row's `sglang_rule` in eagle3/target/families.py:

  plus_one        llama, mistral, qwen2, qwen3, qwen3_moe, ...:  internal = id + 1
                  ("id x" = output of layer x), so id = HF index - 1.
  first_id_is_1   deepseek_v2/v3, kimi_k2 (DeepseekV3), kimi_k25 (wraps it): internal = id + 1 when
                  the first id is 1, else id as-is; we pass the HF indices as-is, which needs the first
                  index != 1 (HF index 1 cannot be expressed).
  gpt_oss         internal = id as-is when max(id) == N, else id + 1. Capture-only mode also rejects
                  ids >= N, so we always take the +1 branch: id = HF index - 1.

Capture-only mode validates ids < N, and the hooks capture a layer's input, so HF index N (the last
layer's output) is out of reach for every family: the final state comes from `last_hidden_state`.
An unknown family is an error that says how to proceed, never a guess (STYLE.md: no behaviour from names).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3.config import ExtractConfig
from eagle3.serving.aux_layers import resolve_aux_layers
from eagle3.target.families import (
    FIRST_ID_IS_1,
    GPT_OSS,
    MODEL_TYPES,
    Family,
    SGLangRule,
    family_of,
    other_tap_problem,
)
from eagle3.target.files import read_model_facts, read_target_config


class LayerMappingError(ValueError):
    """The configured HF layers cannot be captured by SGLang for this model; the message says why."""


def sglang_rule(model_type: str) -> SGLangRule | None:
    """How SGLang 0.5.23's set_eagle3_layers_to_capture reads the ids of a config.json `model_type` (its row's
    rule), or None for a family with no row."""
    family = family_of(model_type)
    return None if family is None else family.sglang_rule


@dataclass(frozen=True)
class SGLangLayers:
    aux_layers: list[int]  # HF hidden_states indices (what the store records)
    layer_ids: list[int]  # --return-aux-hidden-state-layer-ids
    convention: str  # recorded in run.json as engine_layer_convention

    def cli_args(self) -> list[str]:
        return ["--return-aux-hidden-state-layer-ids", *map(str, self.layer_ids)]


def no_rule_message(model_type: str) -> str:
    return (
        f"model_type {model_type!r}: no SGLang layer-id rule is known for this family (EAGLE-3 rules known: "
        f"{', '.join(sorted(t for t in MODEL_TYPES if sglang_rule(t)))}). Read its set_eagle3_layers_to_capture in "
        "sglang/srt/models/ and set extract.sglang_layer_ids (the hook checks the result against extract.aux_layers "
        "at start-up), or add the family's row to eagle3/target/families.py FAMILIES."
    )


def block_drafters_only_message(family: Family, model_type: str) -> str:
    return (
        f"{family.architecture} (model_type {model_type!r}): SGLang 0.5.23 captures it for block drafters only "
        f"(set_dflash_layers_to_capture in sglang/srt/models/{', '.join(family.sglang_files)}), never for an "
        "EAGLE-3 draft: it cannot serve one"
    )


def eagle3_serving_problem(target_cfg: dict[str, Any], override: list[int] | None = None) -> str | None:
    """Why SGLang 0.5.23 cannot feed an EAGLE-3 draft of this target (its config.json) the states this pipeline
    stores and checks (the residual stream, HF hidden_states[i]), or None. `override`: extract.sglang_layer_ids, the
    user's ids for a family with no rule (the hook still checks the layers SGLang resolves them to)."""
    model_type = str(target_cfg.get("model_type", ""))
    family = family_of(model_type)
    if family is None:
        if override is not None:
            return None
        return no_rule_message(model_type)
    if family.sglang_rule is None and override is None:
        return block_drafters_only_message(family, model_type)
    return other_tap_problem(family, target_cfg, "an EAGLE-3 draft")


def extraction_layers(model_dir: Path, extract: ExtractConfig) -> SGLangLayers:
    """The SGLang ids an extraction of the model in `model_dir` passes: `extract.aux_layers` (default EAGLE-3's)
    through the family's rule, or `extract.sglang_layer_ids` where set. The one place a server, engine or check
    derives them from a config; a finished store's are in its run.json (`engine_layer_ids`). A target SGLang cannot
    feed the stored states (eagle3_serving_problem) is refused here, before any server starts."""
    if problem := eagle3_serving_problem(read_target_config(Path(model_dir)), extract.sglang_layer_ids):
        raise LayerMappingError(problem)
    facts = read_model_facts(Path(model_dir))
    aux = resolve_aux_layers(extract.aux_layers, facts.num_layers)
    return sglang_layer_ids(facts.model_type, aux, facts.num_layers, extract.sglang_layer_ids)


def sglang_layer_ids(
    model_type: str, aux_layers: list[int], num_layers: int, override: list[int] | None = None
) -> SGLangLayers:
    """The SGLang ids that make SGLang capture exactly `aux_layers` (HF indices, strictly increasing).

    `override` (extract.sglang_layer_ids) is taken as given for a family without a rule; the hook still
    refuses to dump unless SGLang's resolved layers_to_capture equal `aux_layers`."""
    family = sglang_rule(model_type)
    if override is not None:
        if len(override) != len(aux_layers):
            raise LayerMappingError(
                f"extract.sglang_layer_ids {override} must name as many layers as extract.aux_layers {aux_layers}"
            )
        return SGLangLayers(
            list(aux_layers), list(override), f"sglang {model_type}: ids set by extract.sglang_layer_ids"
        )
    if family is None and (row := family_of(model_type)) is not None:
        raise LayerMappingError(block_drafters_only_message(row, model_type))
    if family is None:
        raise LayerMappingError(no_rule_message(model_type))
    bad = [i for i in aux_layers if not 1 <= i < num_layers]
    if bad:
        raise LayerMappingError(
            f"extract.aux_layers {aux_layers}: {bad} cannot be captured by SGLang for a {num_layers}-layer model "
            f"(it captures layer inputs, HF indices 1..{num_layers - 1}; the final state is last_hidden_state)"
        )
    if family == FIRST_ID_IS_1:
        if aux_layers[0] == 1:
            raise LayerMappingError(
                f"extract.aux_layers {aux_layers}: SGLang's {model_type} rule adds 1 to every id when the first "
                "is 1, so HF index 1 cannot be requested; start from index 2 or higher"
            )
        ids = list(aux_layers)
        convention = f"sglang {model_type}: internal = id (+1 only when the first id is 1); internal i = HF index i"
    else:
        ids = [i - 1 for i in aux_layers]
        convention = f"sglang {model_type}: internal = id + 1 (id x = output of layer x); internal i = HF index i"
    return SGLangLayers(aux_layers=list(aux_layers), layer_ids=ids, convention=convention)


def internal_indices(model_type: str, layer_ids: list[int], num_layers: int) -> list[int]:
    """What SGLang 0.5.23 does with `layer_ids` (the inverse, for tests and doctor)."""
    family = sglang_rule(model_type)
    if family == FIRST_ID_IS_1:
        return [i + 1 for i in layer_ids] if layer_ids and layer_ids[0] == 1 else list(layer_ids)
    if family == GPT_OSS and layer_ids and max(layer_ids) == num_layers:
        return list(layer_ids)
    if family is None:
        raise LayerMappingError(f"model_type {model_type!r}: unknown SGLang family")
    return [i + 1 for i in layer_ids]
