"""EAGLE-3 (Li et al., 2025): one decoder layer over [token embedding; fc(K target states)], trained with the
training-time test (TTT) unrolled over train.ttt_steps, drafting a chain of k tokens one forward each.
EAGLE-3.1 (eagle3/draft/eagle3_1/) is this method with two flags (Eagle3Flags).

    model.py    the draft, in SGLang's LlamaForCausalLMEagle3 key names
    loss.py     the TTT loss over the target distribution
    drafter.py  the chain drafter the offline evaluator runs
    serving.py  the exported config.json (SGLang, speculators)

May import: eagle3.config, eagle3.draft, eagle3.target
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Literal, cast

from torch import Tensor, nn

from eagle3.draft.distill import DraftLoss, TargetDist
from eagle3.draft.eagle3 import serving
from eagle3.draft.eagle3.drafter import EagleDrafter
from eagle3.draft.eagle3.loss import ttt_loss
from eagle3.draft.eagle3.model import Eagle3Draft, Eagle3Flags
from eagle3.draft.layers import AttendFn
from eagle3.draft.method import Drafter, pick_layers
from eagle3.draft.shape import DraftConfig

if TYPE_CHECKING:
    from eagle3.config import TrainConfig
    from eagle3.draft.data import PackedBatch


def default_layers(num_layers: int) -> list[int]:
    """EAGLE-3's low, middle and high layers as HF hidden_states indices: [2, N//2, N-3]."""
    return [2, num_layers // 2, num_layers - 3]


class Eagle3Method:
    """EAGLE-3 and its variants: the method's name, SGLang's algorithm and the Eagle3Flags the draft is built with."""

    algorithm = "EAGLE3"  # EAGLE-3.1 is served by the same algorithm; config.json's flags tell SGLang which
    capture: Literal["eagle3", "dflash"] = "eagle3"
    speculators_note = ""

    def __init__(self, name: str, flags: Eagle3Flags) -> None:
        self.name, self.flags = name, flags

    def layers(self, store_layers: Sequence[int], num_layers: int, requested: Sequence[int] | None) -> list[int]:
        """train.aux_layers, else a 3-layer store's layers as they are (extract.aux_layers chose them), else
        EAGLE-3's default three, which a larger store must hold."""
        if requested is None and len(store_layers) == 3:
            return list(store_layers)
        return pick_layers(self.name, store_layers, requested, default_layers(num_layers))

    def check(self, cfg: TrainConfig, target: dict[str, Any] | None = None) -> None:
        """Every setting of the train section is one EAGLE-3 trains with."""

    def positions(self, cfg: TrainConfig) -> int:
        return cfg.ttt_steps

    def max_draft_steps(self, cfg: TrainConfig) -> int | None:
        return None  # a chain of any length (beyond ttt_steps untrained, yet exact)

    def build(
        self,
        cfg: DraftConfig,
        embedding: Tensor | None = None,
        *,
        lm_head: Tensor | None = None,
        train: TrainConfig | None = None,
    ) -> nn.Module:
        """The draft has its own lm_head over the draft vocabulary: the target's is not kept."""
        return Eagle3Draft(cfg, embedding, self.flags)

    def loss(
        self,
        net: Callable[..., Any],
        model: nn.Module,
        batch: PackedBatch,
        target: TargetDist,
        cfg: TrainConfig,
        attend: AttendFn,
        autocast: Callable[[], AbstractContextManager[Any]],
        fused: bool,
    ) -> DraftLoss:
        """The TTT forward through `net` over ttt_steps, then the TTT loss."""
        d2t = cast(Eagle3Draft, model).d2t
        with autocast():
            logits = net(batch.input_ids, batch.aux_hidden, batch.positions, batch.remaining, attend, cfg.ttt_steps)
        return ttt_loss(logits, target, batch.loss_mask, batch.remaining, d2t, cfg.ttt_decay, cfg.target_chunk_tokens,
                        fused=fused)  # fmt: skip

    def drafter(self, model: nn.Module) -> Drafter:
        return EagleDrafter(cast(Eagle3Draft, model))

    def sglang_config(
        self, cfg: DraftConfig, layer_ids: list[int], *, train: TrainConfig | None = None
    ) -> dict[str, Any]:
        return serving.sglang_config(cfg, layer_ids, self.flags)

    def speculators_config(
        self,
        cfg: DraftConfig,
        layer_ids: list[int],
        *,
        verifier: str,
        verifier_architectures: list[str],
        speculative_tokens: int,
    ) -> dict[str, Any] | None:
        return serving.speculators_config(cfg, layer_ids, self.flags, verifier=verifier,
                                          verifier_architectures=verifier_architectures,
                                          speculative_tokens=speculative_tokens)  # fmt: skip

    def speculators_key(self, name: str) -> str:
        return serving.speculators_key(name)

    def serve_flags(self, train: TrainConfig | None, speculative_tokens: int) -> list[str]:
        k = speculative_tokens
        return ["--speculative-num-steps", str(k), "--speculative-eagle-topk", "1",
                "--speculative-num-draft-tokens", str(k + 1)]  # fmt: skip


METHOD = Eagle3Method("eagle3", Eagle3Flags())
