"""Where the draft reads the target's embedding and lm_head: a causal LM's keys or a wrapper's, tied at either level
of its config (Gemma-4's wrapper ties by its top-level flag while its text_config says untied)."""

from __future__ import annotations

from eagle3.draft.load import target_head_keys
from eagle3.target.layout import HEAD_KEYS


def test_an_untied_target_reads_only_a_saved_head() -> None:
    keys = target_head_keys({"tie_word_embeddings": False, "text_config": {"tie_word_embeddings": False}})
    assert keys["lm_head"] == HEAD_KEYS and "model.embed_tokens.weight" in keys["embedding"]


def test_a_tie_at_either_level_falls_back_to_the_embedding_after_a_saved_head() -> None:
    for cfg in ({"tie_word_embeddings": True, "text_config": {"tie_word_embeddings": False}},
                {"text_config": {"tie_word_embeddings": True}}, {"tie_word_embeddings": True}):  # fmt: skip
        head = target_head_keys(cfg)["lm_head"]
        assert head[: len(HEAD_KEYS)] == HEAD_KEYS, cfg  # a checkpoint that saves the head anyway: that one
        assert "model.language_model.embed_tokens.weight" in head[len(HEAD_KEYS) :], cfg
