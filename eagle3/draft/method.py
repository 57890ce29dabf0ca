"""The seam between the shared training, export and evaluation and what is specific to one draft method.

A method is a folder, eagle3/draft/<method>/, whose `METHOD` implements DraftMethod; eagle3/draft/methods.py is the
table of them, keyed by `train.method`. Everything else is written once and shared: the trainer loop
(eagle3/train/trainer.py: DDP/FSDP2, resume, compile, multi-node, warm start), the data loader, checkpoints, the
held-out split, the target distribution and soft cross-entropy (distill.py), export's atomic write and key check
(eagle3/release/export.py), and the evaluator's exact greedy verification (eagle3/evaluate/speculative.py).

What a method says (docs/methods.md has the table):
    name, algorithm        train.method's value; SGLang's --speculative-algorithm
    layers                 which of the store's aux layers the draft reads (a subset: the store may hold more)
    build                  the draft module from the target-derived shape (shape.py), the target's embedding and
                           lm_head, and the train settings
    loss                   one packed batch -> DraftLoss, per draft position (distill.py)
    drafter                the offline evaluator's drafting procedure (a Drafter)
    sglang_config          config.json of the directory SGLang loads; the weights keep the module's key names
    speculators_config     the speculators (vLLM) layout's config.json, or None with `speculators_note` saying why
    serve_flags            SGLang's speculative flags that serve it (chain length, block size)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Literal, Protocol

from torch import Tensor, nn

from eagle3.draft.distill import DraftLoss, TargetDist
from eagle3.draft.layers import AttendFn
from eagle3.draft.shape import DraftConfig

if TYPE_CHECKING:
    from eagle3.config import TrainConfig
    from eagle3.draft.data import PackedBatch


class MethodError(ValueError):
    """A method cannot train on this store or with these settings; names the key, the value and the fix."""


class Drafter(Protocol):
    """What speculative decoding needs of a draft. Positions are absolute; tokens are target ids."""

    def start(self, tokens: list[int], aux: Tensor) -> None:
        """The prompt and the target's first token, x[0..n-1]; aux [n-1, K, H] of positions 0..n-2."""

    def propose(self, n: int) -> list[int]:
        """n drafted tokens for positions n.. (after the last committed token)."""
        ...

    def commit(self, tokens: list[int], aux: Tensor) -> None:
        """Tokens emitted by a round; aux [len(tokens), K, H] of the positions before each of them."""


class DraftModule(Protocol):
    """What the shared trainer, checkpoints and export need of a method's draft (an nn.Module)."""

    cfg: DraftConfig
    d2t: Tensor
    t2d: Tensor

    def set_vocab_map(self, d2t: Tensor, t2d: Tensor) -> None: ...

    def trainable_state_dict(self) -> dict[str, Tensor]: ...

    def compile_blocks(self) -> None: ...


class DraftMethod(Protocol):
    name: str  # train.method
    algorithm: str  # sglang.launch_server --speculative-algorithm
    # the SGLang capture that feeds the draft when served: EAGLE-3's (set_eagle3_layers_to_capture) or the block
    # drafters' (set_dflash_layers_to_capture); a family may have one and not the other (eagle3/target/families.py)
    capture: Literal["eagle3", "dflash"]
    speculators_note: str  # why speculators_config is None, when it is

    def layers(self, store_layers: Sequence[int], num_layers: int, requested: Sequence[int] | None) -> list[int]:
        """The HF hidden_states indices the draft reads, in the store's order; MethodError when the store lacks
        them (naming the missing layers and the extraction that adds them)."""
        ...

    def check(self, cfg: TrainConfig, target: dict[str, Any] | None = None) -> None:
        """Refuse train settings, or a target (its config.json, where known), this method cannot train or serve
        (MethodError naming the key and the fix)."""

    def positions(self, cfg: TrainConfig) -> int:
        """S: the draft positions the loss reports (TTT steps, a block's tokens)."""
        ...

    def max_draft_steps(self, cfg: TrainConfig) -> int | None:
        """The most tokens one drafting round can propose (a block drafter: its block less the anchor); None: any
        chain length. The evaluation's chain lengths above it are refused before the run."""
        ...

    def build(
        self,
        cfg: DraftConfig,
        embedding: Tensor | None = None,
        *,
        lm_head: Tensor | None = None,
        train: TrainConfig | None = None,
    ) -> nn.Module:
        """The draft (a DraftModule), fresh; `embedding` and `lm_head` [V, H] are the target's, frozen (a draft that
        drafts through the target's head keeps it, unsaved); `train`: the settings it was (or is) trained with (None:
        the defaults; a method whose weights depend on them must not use None)."""
        ...

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
        """One packed batch through `net` (the draft, or its DDP wrapper) -> the loss per draft position."""
        ...

    def drafter(self, model: nn.Module) -> Drafter: ...

    def sglang_config(
        self, cfg: DraftConfig, layer_ids: list[int], *, train: TrainConfig | None = None
    ) -> dict[str, Any]:
        """config.json of the SGLang directory: `layer_ids` are the ids SGLang's capture for this method names the
        draft's layers by (export: EAGLE-3's rule, or a block drafter's dflash_config.target_layer_ids by the family's
        DFlash rule); `train` the draft's training settings (its checkpoint's)."""
        ...

    def speculators_config(
        self,
        cfg: DraftConfig,
        layer_ids: list[int],
        *,
        verifier: str,
        verifier_architectures: list[str],
        speculative_tokens: int,
    ) -> dict[str, Any] | None: ...

    def speculators_key(self, name: str) -> str: ...

    def serve_flags(self, train: TrainConfig | None, speculative_tokens: int) -> list[str]:
        """SGLang's speculative flags for serving the draft beyond the algorithm and the draft path (EAGLE-3: a chain
        of `speculative_tokens`; a block drafter: its block, whatever `speculative_tokens` says)."""
        ...


def pick_layers(
    method: str, store_layers: Sequence[int], requested: Sequence[int] | None, default: Sequence[int]
) -> list[int]:
    """The layers a draft reads: `requested` (train.aux_layers) or the method's `default`, each of which the store
    must hold. Returned in the store's order (the order SGLang concatenates them in at serving time)."""
    want = list(requested) if requested is not None else list(default)
    missing = [x for x in want if x not in store_layers]
    if missing:
        union = sorted({*store_layers, *want})
        key = "train.aux_layers" if requested is not None else f"train.method {method}'s default layers"
        raise MethodError(
            f"{key} {want}: the store holds aux layers {list(store_layers)}, not {missing}. Choose layers the store "
            f"holds (train.aux_layers), or extract them again into a new store with extract.aux_layers: {union}"
        )
    if len(set(want)) != len(want):
        raise MethodError(f"train.aux_layers {want} repeats a layer; give each layer once")
    return [x for x in store_layers if x in want]
