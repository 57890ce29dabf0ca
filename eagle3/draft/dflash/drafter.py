"""DFlash's drafting procedure for the offline evaluator: one draft forward per round drafts a whole block, as
SGLang's DFlash worker does. The context keys and values of every committed position are cached per layer (SGLang
materializes them into the draft's KV cache the same way: kv_proj_only, k_norm, RoPE); a round's block is
[last committed token, mask x (B-1)] at the next positions, and its outputs 1..n are the n drafted tokens, the argmax
of the target's lm_head over its whole vocabulary.
"""

from __future__ import annotations

import torch
from torch import Tensor

from eagle3.draft.dflash.model import KV, DFlashDraft


class BlockDrafter:
    def __init__(self, draft: DFlashDraft):
        self.draft = draft
        self.kv: list[KV] = []  # per layer: keys, values of the context positions 0..p-1
        self.last = -1  # the last committed token: the next block's anchor, at position p = len(context)

    @property
    def context_len(self) -> int:
        return 0 if not self.kv else self.kv[0][0].shape[0]

    def start(self, tokens: list[int], aux: Tensor) -> None:
        self.kv = []
        self.commit(tokens[1:], aux)  # aux[j] is position j's, before token j+1

    def commit(self, tokens: list[int], aux: Tensor) -> None:
        d = self.draft
        dev = d.fc.weight.device
        p = self.context_len
        positions = torch.arange(p, p + len(tokens), device=dev)
        new = d.context_kv(d.context(aux.to(dev)), positions)
        self.kv = new if not self.kv else [(torch.cat([k, k2]), torch.cat([v, v2])) for (k, v), (k2, v2) in
                                           zip(self.kv, new, strict=True)]  # fmt: skip
        self.last = tokens[-1]

    def rows(self) -> Tensor:
        """The drafting rows [B - 1, H] of the block anchored on the last committed token."""
        d = self.draft
        dev, q, p = d.fc.weight.device, d.queries, self.context_len
        ids = d.block_input(torch.tensor([self.last], device=dev)).flatten()  # [Q]
        mask = torch.ones(q, p + q, dtype=torch.bool, device=dev)  # the whole context, the whole block
        return d.drafting_rows(d.blocks(ids, torch.arange(p, p + q, device=dev), self.kv, mask))

    def propose(self, n: int) -> list[int]:
        if n > self.draft.block_size - 1:
            raise ValueError(
                f"a DFlash draft of block_size {self.draft.block_size} drafts at most {self.draft.block_size - 1} "
                f"tokens a round, not {n}: evaluate with draft_steps <= {self.draft.block_size - 1}"
            )
        return self.draft.draft(self.rows()[:n], self.last)
