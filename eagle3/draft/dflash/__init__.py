"""DFlash (block diffusion drafting, z-lab; served by SGLang 0.5.23's DFlashDraftModel): a few decoder layers that
read the concatenated states of K target layers as attention context and draft a whole block of B - 1 tokens in one
forward: the block is the last verified token (the anchor) and B - 1 mask tokens, attended to in both directions.
Trained on random anchors per row, every block position predicted in parallel (loss.py).

    model.py    the draft, in SGLang's DFlashDraftModel key names; how target states enter
    loss.py     anchors, the block mask, the position-weighted cross-entropy
    drafter.py  the block drafter the offline evaluator runs
    serving.py  config.json, the target layer ids and how they map to HF hidden_states indices

Draft layers = K, the target layers it reads (SGLang's own default pairs them the same way: build_target_layer_ids
picks one target layer per draft layer). Default K = 5 at SGLang's build_target_layer_ids(N, 5), as HF indices.

May import: eagle3.config, eagle3.draft, eagle3.target
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Literal, cast

from torch import Tensor, nn

from eagle3.draft.dflash import serving
from eagle3.draft.dflash.drafter import BlockDrafter
from eagle3.draft.dflash.loss import block_loss, block_mask, flex_block_mask, pick_anchors
from eagle3.draft.dflash.model import DFlashDraft
from eagle3.draft.distill import DraftLoss, TargetDist
from eagle3.draft.layers import AttendFn
from eagle3.draft.method import Drafter, pick_layers
from eagle3.draft.shape import DraftConfig

if TYPE_CHECKING:
    from eagle3.config import TrainConfig
    from eagle3.draft.data import PackedBatch

DEFAULT_NUM_LAYERS = 5  # target layers read (and draft layers), as the published DFlash / DSpark drafts


def default_layers(num_layers: int) -> list[int]:
    """SGLang's build_target_layer_ids(N, 5) as HF hidden_states indices (id k = the output of layer k = HF k + 1,
    the rule of every family with a DFlash capture but Muse Glimmer's)."""
    return [x + 1 for x in serving.build_target_layer_ids(num_layers, DEFAULT_NUM_LAYERS)]


def settings(train: TrainConfig | None) -> TrainConfig:
    """The draft's train settings, the config's defaults when none are given (block size, mask id, Markov rank)."""
    from eagle3.config import TrainConfig

    return train if train is not None else TrainConfig.model_validate({})


def mask_token_id(cfg: DraftConfig, train: TrainConfig | None) -> int:
    """train.mask_token_id, else the target's last vocabulary id."""
    chosen = settings(train).mask_token_id
    return chosen if chosen is not None else cfg.vocab_size - 1


def checked_mask_token_id(cfg: DraftConfig, train: TrainConfig | None) -> int:
    """mask_token_id, refused (DraftConfigError) when it is not a token of the target, as SGLang refuses it."""
    from eagle3.draft.shape import DraftConfigError

    mask = mask_token_id(cfg, train)
    if mask >= cfg.vocab_size:
        raise DraftConfigError(
            f"train.mask_token_id {mask} is not below the target's vocab_size {cfg.vocab_size} (SGLang refuses "
            "it); choose a token id of the target"
        )
    return mask


class DFlashMethod:
    name = "dflash"
    algorithm = "DFLASH"
    capture: Literal["eagle3", "dflash"] = "dflash"
    speculators_note = (
        "speculators 0.9 converts this directory itself: speculators.convert.entrypoints.convert_model(model=<this "
        "directory>, verifier=<the target>, algorithm='dflash') (DFlashConverter; tests/integration/"
        "test_block_drafters.py loads the result back)"
    )

    def layers(self, store_layers: Sequence[int], num_layers: int, requested: Sequence[int] | None) -> list[int]:
        """train.aux_layers, else a 5-layer store's layers as they are (extract.aux_layers chose them, as EAGLE-3
        takes a 3-layer store's), else SGLang's default five (default_layers), which a larger store must hold."""
        if requested is None and len(store_layers) == DEFAULT_NUM_LAYERS:
            return list(store_layers)
        return pick_layers(self.name, store_layers, requested, default_layers(num_layers))

    def check(self, cfg: TrainConfig, target: dict[str, Any] | None = None) -> None:
        """Every block size the config allows (2..64) is one SGLang serves; a target must be of a family SGLang
        0.5.23 captures for block drafters (set_dflash_layers_to_capture)."""
        if target is not None:
            serving.dflash_rule_of(str(target.get("model_type", "")))

    def positions(self, cfg: TrainConfig) -> int:
        return cfg.block_size - 1

    def max_draft_steps(self, cfg: TrainConfig) -> int | None:
        return cfg.block_size - 1  # one forward drafts the block after its anchor

    def build(
        self,
        cfg: DraftConfig,
        embedding: Tensor | None = None,
        *,
        lm_head: Tensor | None = None,
        train: TrainConfig | None = None,
    ) -> nn.Module:
        mask = checked_mask_token_id(cfg, train)
        return DFlashDraft(cfg, num_layers=cfg.num_aux, block_size=settings(train).block_size, mask_token_id=mask,
                           embed_weight=embedding, lm_head=lm_head)  # fmt: skip

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
        """Random anchors of the row, their blocks through `net` in one forward, the weighted cross-entropy.
        `attend` (causal within documents) is not DFlash's attention: the block mask is built here."""
        draft = cast(DFlashDraft, model)
        anchors, real = pick_anchors(batch, draft.block_size, cfg.seed)
        flex = cfg.flex(batch.doc.device.type)
        mask = (flex_block_mask if flex else block_mask)(batch.doc, anchors, draft.queries)
        with autocast():
            out = net(batch.aux_hidden, batch.positions, batch.input_ids[anchors], batch.positions[anchors], mask)
        return block_loss(out, draft, batch, anchors, real, target, cfg.target_chunk_tokens)

    def drafter(self, model: nn.Module) -> Drafter:
        return BlockDrafter(cast(DFlashDraft, model))

    def sglang_config(
        self, cfg: DraftConfig, layer_ids: list[int], *, train: TrainConfig | None = None
    ) -> dict[str, Any]:
        """`layer_ids`: dflash_config.target_layer_ids (serving.target_layer_ids, the family's DFlash rule)."""
        return serving.sglang_config(
            cfg,
            num_layers=cfg.num_aux,
            block_size=settings(train).block_size,
            mask_token_id=mask_token_id(cfg, train),
            layer_ids=layer_ids,
        )

    def speculators_config(
        self,
        cfg: DraftConfig,
        layer_ids: list[int],
        *,
        verifier: str,
        verifier_architectures: list[str],
        speculative_tokens: int,
    ) -> dict[str, Any] | None:
        return None

    def speculators_key(self, name: str) -> str:
        return name

    def serve_flags(self, train: TrainConfig | None, speculative_tokens: int) -> list[str]:
        """The verify width is the block (SGLang would override the config's block size with another value, and
        serves DFlash / DSpark with one step of top-1 whatever it is given)."""
        return ["--speculative-num-draft-tokens", str(settings(train).block_size)]


METHOD = DFlashMethod()
