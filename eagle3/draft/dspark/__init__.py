"""DSpark (DeepSeek; served by SGLang 0.5.23's DSparkDraftModel): DFlash's block backbone (eagle3/draft/dflash/) with
a low-rank Markov head that corrects each drafted token's logits from the token before it, and a confidence head
(model.py). Trained as DFlash (random anchors, the block in one forward, position-weighted cross-entropy, here over
the Markov-corrected logits, teacher-forced on the data's previous token) plus the confidence head's cross-entropy
against whether each position's argmax is the target's token.

    model.py    the Markov and confidence heads on DFlash's draft, SGLang's key names; the semi-autoregressive drafting
    serving.py  config.json

May import: eagle3.config, eagle3.draft, eagle3.target
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import Tensor, nn

from eagle3.draft.dflash import DFlashMethod, checked_mask_token_id, mask_token_id, settings
from eagle3.draft.dspark import serving
from eagle3.draft.dspark.model import DSparkDraft
from eagle3.draft.shape import DraftConfig

if TYPE_CHECKING:
    from eagle3.config import TrainConfig


class DSparkMethod(DFlashMethod):
    name = "dspark"
    algorithm = "DSPARK"
    speculators_note = (
        "speculators 0.9 has a DSpark model but no converter from SGLang's layout, and its keys were not checked here; "
        "serve the SGLang directory"
    )

    def build(
        self,
        cfg: DraftConfig,
        embedding: Tensor | None = None,
        *,
        lm_head: Tensor | None = None,
        train: TrainConfig | None = None,
    ) -> nn.Module:
        mask, s = checked_mask_token_id(cfg, train), settings(train)
        return DSparkDraft(cfg, num_layers=cfg.num_aux, block_size=s.block_size, mask_token_id=mask,
                           markov_rank=s.markov_rank, markov_head=s.markov_head, embed_weight=embedding,
                           lm_head=lm_head)  # fmt: skip

    def sglang_config(
        self, cfg: DraftConfig, layer_ids: list[int], *, train: TrainConfig | None = None
    ) -> dict[str, Any]:
        return serving.sglang_config(
            cfg,
            num_layers=cfg.num_aux,
            block_size=settings(train).block_size,
            mask_token_id=mask_token_id(cfg, train),
            markov_rank=settings(train).markov_rank,
            markov_head=settings(train).markov_head,
            layer_ids=layer_ids,
        )


METHOD = DSparkMethod()
