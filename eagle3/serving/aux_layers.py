"""Layer indices: the store speaks Hugging Face `hidden_states` indices; engines map to their own.

HF index i is `model(..., output_hidden_states=True).hidden_states[i]`: 0 = embeddings, i = input of
decoder layer i (= output of layer i-1). Getting this wrong trains a draft on the wrong features and
fails silently at serve time, so every engine records both lists in run.json.
"""

from __future__ import annotations


def default_aux_layers(num_layers: int) -> list[int]:
    """EAGLE-3's default low/mid/high features: [2, N//2, N-3] as HF indices."""
    return [2, num_layers // 2, num_layers - 3]


def resolve_aux_layers(configured: list[int] | None, num_layers: int) -> list[int]:
    """The configured HF indices, or the default; checked against the model depth."""
    layers = list(configured) if configured else default_aux_layers(num_layers)
    bad = [i for i in layers if not 1 <= i <= num_layers]
    if bad:
        raise ValueError(
            f"extract.aux_layers {layers}: {bad} out of range for a {num_layers}-layer model "
            f"(HF hidden_states indices 1..{num_layers}; 0 is the embedding output)"
        )
    if sorted(set(layers)) != layers:
        raise ValueError(f"extract.aux_layers {layers} must be strictly increasing")
    return layers
