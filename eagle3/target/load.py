"""The one way a target model is loaded in this process: the transformers engine, the prompts stage, synthesize
and the offline evaluator all call load_causal_lm."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3.target.files import read_target_config

if TYPE_CHECKING:
    import torch


def auto_class(model_dir: Path) -> Any:
    """transformers' auto class that loads the target in `model_dir` whole (auto_class_of its config.json)."""
    return auto_class_of(read_target_config(model_dir))


def auto_class_of(cfg: dict[str, Any]) -> Any:
    """transformers' auto class for a model of this config: AutoModelForCausalLM, or, for a multimodal wrapper
    transformers has no causal LM for (Qwen2.5-VL, Qwen3-VL, Kimi-K2.5) or whose causal LM is its text model alone
    (Qwen3.5's and Llama-4's wrappers: that class would not find the wrapper's tensors), AutoModelForImageTextToText.
    Fed text only, a wrapper runs its language model: logits and `hidden_states` are that model's."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as causal_lms
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES as wrappers

    model_type = cfg.get("model_type")
    if model_type in wrappers and ("text_config" in cfg or model_type not in causal_lms):
        return AutoModelForImageTextToText
    return AutoModelForCausalLM


def load_causal_lm(model_dir: Path, dtype: torch.dtype, device: torch.device | str | None) -> Any:
    """The target (auto_class) in eval mode, on `device`; None: spread by accelerate over the visible GPUs
    (device_map="auto", for a model one GPU does not hold). No process-wide cache: the caller holds the weights as
    long as it needs them (eagle3.extract.engines.transformers_engine.LoadedModels)."""
    auto = auto_class(Path(model_dir))
    if device is None:
        model: Any = auto.from_pretrained(model_dir, dtype=dtype, device_map="auto")
        return model.eval()
    model = auto.from_pretrained(model_dir, dtype=dtype)
    return model.to(device).eval()


def decoder_stack(model: Any) -> Any:
    """The target without its lm_head, whose `hidden_states` are the language model's (LlamaModel for
    LlamaForCausalLM; a wrapper's model, which runs its language model on text alone)."""
    base = model.base_model
    if base is not model:
        return base
    # a base_model_prefix naming no attribute hands back the whole model: Llama4ForCausalLM's stack is `model`, and
    # Llama-4's wrapper holds a causal LM as `language_model`
    inner = getattr(model, "language_model", None)
    return inner.model if inner is not None else model.model
