"""What SGLang 0.5.23 reads of a DSpark draft (sglang/srt/models/dspark.py, srt/speculative/dspark_components/
dspark_config.py): DFlash's config.json (eagle3/draft/dflash/serving.py) with

    architectures                   ["DSparkDraftModel"]
    markov_rank, markov_head_type   the Markov head's rank and kind (train.markov_head: "vanilla": markov_w1,
                                    markov_w2; "gated": + gate_proj; "rnn": + joint_proj); DSpark refuses rank 0
    enable_confidence_head          true: SGLang then requires confidence_head.proj.{weight,bias} (unless
    confidence_head_with_markov     SGLANG_RAGGED_VERIFY_MODE=static); the head reads [row; markov_w1[prev]]
    sample_from_anchor              true: the anchor's row drafts the first token, so the block has gamma query rows
    dflash_config.block_size        gamma = train.block_size - 1, the drafted tokens (SGLang's
                                    --speculative-num-draft-tokens is gamma + 1 = train.block_size)

The weights are DFlash's plus markov_head.markov_w{1,2}.weight and confidence_head.proj.{weight,bias}; SGLang skips
lm_head.* and embed_tokens.* (it borrows the target's) and refuses an unknown markov_head.* or confidence_head.* key.
"""

from __future__ import annotations

from typing import Any

from eagle3.draft.dflash import serving as dflash
from eagle3.draft.shape import DraftConfig


def sglang_config(
    cfg: DraftConfig, *, num_layers: int, block_size: int, mask_token_id: int, markov_rank: int, markov_head: str,
    layer_ids: list[int],
) -> dict[str, Any]:
    gamma = block_size - 1
    out = dflash.sglang_config(cfg, num_layers=num_layers, block_size=gamma, mask_token_id=mask_token_id,
                               layer_ids=layer_ids)  # fmt: skip
    out.update(
        architectures=["DSparkDraftModel"],
        markov_rank=markov_rank,
        markov_head_type=markov_head,
        enable_confidence_head=True,
        confidence_head_with_markov=True,
        sample_from_anchor=True,
    )
    return out
