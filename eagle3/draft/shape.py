"""The draft's shape, derived from the target's config.json: what every draft method shares (hidden size and
embedding, attention heads, RoPE, norms, vocabularies). A method builds its own layers from it (eagle3/draft/<method>/).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from eagle3.target.families import family_of
from eagle3.target.layout import text_config


class DraftConfigError(ValueError):
    """The target config.json lacks something the draft needs."""


MLA_DRAFT_HEAD_DIM = 128  # the published DeepSeek-V3 / Kimi EAGLE-3 drafts' (and every attention kernel's) size


@dataclass(frozen=True)
class DraftConfig:
    hidden_size: int  # H of the draft; equals the target's (the embedding is shared)
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None  # None (plain) or {"rope_type": "llama3", "factor", ...}
    max_position_embeddings: int
    target_hidden_size: int
    num_aux: int  # K
    vocab_size: int  # target vocabulary
    draft_vocab_size: int

    note: str = field(default="", compare=False)  # what from_target chose differently from the target, for logs

    @classmethod
    def from_target(cls, target: dict[str, Any], *, num_aux: int, draft_vocab_size: int) -> DraftConfig:
        """The draft of a target described by its config.json (multimodal wrappers: its text_config).

        Attention is Llama's GQA with the target's heads, except for MLA targets (DeepSeek-V3, Kimi: q/k and v
        head sizes differ, and config.json's head_dim, where present, is the rope part): head_dim 128, heads =
        H / 128, as the published DeepSeek and Kimi EAGLE-3 drafts are shaped. Which it is comes from the family's
        row (eagle3/target/families.py `attention`); a model_type with no row is MLA when it has a `kv_lora_rank`.
        RoPE is the target's when the draft can reproduce it in SGLang's Llama draft ('default', 'llama3'); any
        other scaling (yarn on DeepSeek-V3, Kimi, GPT-OSS) gives plain RoPE at the target's theta, as those
        published drafts do: the draft learns its own attention, it does not reuse the target's."""
        text = text_config(target)
        act = text.get("hidden_act", "silu")
        try:
            h, nh = int(text["hidden_size"]), int(text["num_attention_heads"])
            nkv, hd = int(text.get("num_key_value_heads", nh)), int(text.get("head_dim") or h // nh)
            notes = []
            if act != "silu":  # the draft's own MLP: SGLang's Llama draft layer is SiLU whatever the target's
                notes.append(f"target hidden_act {act!r}: the draft's MLP uses silu")
            if _attention(target) == "mla":
                hd = MLA_DRAFT_HEAD_DIM if h % MLA_DRAFT_HEAD_DIM == 0 else h // nh
                nh = nkv = h // hd
                notes.append(f"MLA target: the draft's attention is {nh} heads x {hd}")
            rope = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
            theta = float(rope.pop("rope_theta", text.get("rope_theta", 10000.0)))
            kind = rope.get("rope_type", rope.get("type", "default"))
            if kind not in ("default", "llama3"):
                notes.append(f"target rope_type {kind!r}: the draft uses plain RoPE at theta {theta:g}")
            return cls(
                hidden_size=h,
                # LongCat-Flash names its dense MLP's width ffn_hidden_size
                intermediate_size=int(text.get("intermediate_size") or text["ffn_hidden_size"]),
                num_heads=nh,
                num_kv_heads=nkv,
                head_dim=hd,
                rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
                rope_theta=theta,
                rope_scaling={"rope_type": "llama3", **rope} if kind == "llama3" else None,
                max_position_embeddings=int(text.get("max_position_embeddings", 8192)),
                target_hidden_size=h,
                num_aux=num_aux,
                vocab_size=int(text["vocab_size"]),
                draft_vocab_size=draft_vocab_size,
                note="; ".join(notes),
            )
        except KeyError as e:
            raise DraftConfigError(f"target config.json lacks {e.args[0]!r}") from None

    def llama_config(self) -> dict[str, Any]:
        """The config.json fields SGLang's LlamaForCausalLMEagle3 reads (export adds eagle_config)."""
        return {
            "architectures": ["LlamaForCausalLMEagle3"],
            "model_type": "llama",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "num_hidden_layers": 1,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "max_position_embeddings": self.max_position_embeddings,
            "vocab_size": self.vocab_size,
            "draft_vocab_size": self.draft_vocab_size,
            "target_hidden_size": self.target_hidden_size,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
        }


def _attention(target: dict[str, Any]) -> str:
    """The target's attention kind: its family's row, else (a family with no row, or a row that leaves it to the
    config) MLA when it has a kv_lora_rank."""
    family = family_of(str(target.get("model_type", "")))
    if family is not None and family.attention is not None:
        return family.attention
    return "mla" if text_config(target).get("kv_lora_rank") else "gqa"
