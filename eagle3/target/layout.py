"""Where a target keeps its language model: in config.json (`text_config`) and in its safetensors (the prefixes and
lm_head keys). A multimodal wrapper (Kimi-K2.5) keeps the language model's config under `text_config` and its tensors
under `language_model.`; transformers 5 saves a wrapper's under `model.language_model.`. Every reader looks for the
keys of each layout in turn (first found wins), so none guesses the layout from a name.
"""

from __future__ import annotations

from typing import Any

#: (prefix of the LM's tensors, its lm_head key), in the order they are tried: a causal LM's, a wrapper's
#: (Kimi-K2.5: `language_model.`), transformers 5's wrapper layout. `<prefix>embed_tokens.weight`,
#: `<prefix>norm.weight`.
LM_LAYOUTS: tuple[tuple[str, str], ...] = (
    ("model.", "lm_head.weight"),
    ("language_model.model.", "language_model.lm_head.weight"),
    ("model.language_model.", "lm_head.weight"),
    ("backbone.", "lm_head.weight"),  # Nemotron-H's checkpoints (transformers 5 saves them under `model.`)
)
LM_PREFIXES: tuple[str, ...] = tuple(prefix for prefix, _ in LM_LAYOUTS)
#: The embedding's name after the prefix: Nemotron-H (a Mamba-2 hybrid) calls it `embeddings`.
EMBEDDING_NAMES: tuple[str, ...] = ("embed_tokens.weight", "embeddings.weight")
HEAD_KEYS: tuple[str, ...] = tuple(dict.fromkeys(head for _, head in LM_LAYOUTS))  # unique, in order


def text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The language model's part of a config.json: a multimodal wrapper's `text_config`, else the config itself."""
    text: dict[str, Any] = cfg.get("text_config", cfg)
    return text
