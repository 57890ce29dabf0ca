"""The draft vocabulary map: the most frequent loss-masked target tokens, as EAGLE-3 and SGLang read it.

    vocab_map.safetensors
      d2t  int64 [draft]         target_id = draft_index + d2t[draft_index]   (SGLang reads only this)
      t2d  bool  [target vocab]  True for the target ids the draft can emit
      __metadata__  format, draft_vocab_size, target_vocab_size, loss_tokens, covered_tokens, distinct_tokens

Selection order: count descending, ties by target id ascending. When the store has fewer distinct
loss-masked ids than the draft size, the rest is filled with unseen ids in ascending id order (count 0,
so the same rule). Draft index i is the i-th id in that order, so `arange(draft) + d2t` lists the
selected ids most frequent first. (SpecForge and speculators sort the selected ids by target id
instead; either order is valid as long as the draft's lm_head rows follow the same map. Their trainers take
the teacher's rows as lm_head[t2d], i.e. in ascending target id, whatever d2t says, so the exports for them write
`ascending(d2t)`: the same draft vocabulary in their order.)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save

from eagle3.store.fsio import atomic_write_bytes

VOCAB_FORMAT = "eagle3-vocab-map/1"


@dataclass(frozen=True)
class VocabMap:
    selected: torch.Tensor  # int64 [draft], target ids, most frequent first
    d2t: torch.Tensor  # int64 [draft]
    t2d: torch.Tensor  # bool [V]
    loss_tokens: int  # loss-masked tokens counted
    covered_tokens: int  # of those, how many have an id in the draft vocabulary
    distinct_tokens: int  # distinct loss-masked ids

    @property
    def coverage(self) -> float:
        return self.covered_tokens / self.loss_tokens if self.loss_tokens else 0.0

    @property
    def draft_vocab_size(self) -> int:
        return int(self.d2t.numel())

    @property
    def target_vocab_size(self) -> int:
        return int(self.t2d.numel())


def select_vocab(counts: torch.Tensor, draft_vocab_size: int) -> VocabMap:
    """counts: int64 [V], loss-masked occurrences of each target id. Keeps min(draft_vocab_size, V) ids."""
    if counts.ndim != 1 or counts.dtype != torch.int64:
        raise ValueError(f"counts must be int64 [V], got {counts.dtype} {tuple(counts.shape)}")
    v = counts.numel()
    draft = min(draft_vocab_size, v)
    # A stable sort keeps equal counts in ascending id order: ties by id, then the unseen ids by id.
    order = torch.sort(counts, descending=True, stable=True).indices
    selected = order[:draft].clone()  # [draft]
    d2t = selected - torch.arange(draft, dtype=torch.int64)  # [draft]
    t2d = torch.zeros(v, dtype=torch.bool)  # [V]
    t2d[selected] = True
    return VocabMap(
        selected=selected,
        d2t=d2t,
        t2d=t2d,
        loss_tokens=int(counts.sum()),
        covered_tokens=int(counts[selected].sum()),
        distinct_tokens=int((counts > 0).sum()),
    )


def write_vocab_map(path: Path, vm: VocabMap) -> None:
    meta = {
        "format": VOCAB_FORMAT,
        "draft_vocab_size": str(vm.draft_vocab_size),
        "target_vocab_size": str(vm.target_vocab_size),
        "loss_tokens": str(vm.loss_tokens),
        "covered_tokens": str(vm.covered_tokens),
        "distinct_tokens": str(vm.distinct_tokens),
    }
    atomic_write_bytes(path, save({"d2t": vm.d2t.contiguous(), "t2d": vm.t2d.contiguous()}, metadata=meta))


def read_vocab_map(path: Path) -> tuple[torch.Tensor, torch.Tensor, dict[str, str]]:
    """(d2t int64 [draft], t2d bool [V], metadata) of a vocab_map.safetensors; checks they agree."""
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        keys = set(f.keys())
        if keys != {"d2t", "t2d"}:
            raise ValueError(f"{path}: keys {sorted(keys)}, expected ['d2t', 't2d']")
        d2t, t2d = f.get_tensor("d2t"), f.get_tensor("t2d")
    if meta.get("format") != VOCAB_FORMAT or d2t.dtype != torch.int64 or t2d.dtype != torch.bool:
        raise ValueError(f"{path}: not a {VOCAB_FORMAT} file (format {meta.get('format')!r}, {d2t.dtype}, {t2d.dtype})")
    check_vocab_map(d2t, t2d, str(path))
    return d2t, t2d, meta


def vocab_map_sizes(path: Path) -> tuple[int, int]:
    """(draft ids, target vocabulary) of a vocab_map.safetensors, from its header alone (no tensor is read)."""
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        if "draft_vocab_size" in meta and "target_vocab_size" in meta:
            return int(meta["draft_vocab_size"]), int(meta["target_vocab_size"])
        return int(f.get_slice("d2t").get_shape()[0]), int(f.get_slice("t2d").get_shape()[0])


def ascending(d2t: torch.Tensor) -> torch.Tensor:
    """The same draft vocabulary with draft ids in ascending target id: the order of lm_head[t2d] (peers' trainers)."""
    ids = torch.sort(torch.arange(d2t.numel(), dtype=torch.int64) + d2t).values
    return ids - torch.arange(d2t.numel(), dtype=torch.int64)


def check_vocab_map(d2t: torch.Tensor, t2d: torch.Tensor, where: str, target_vocab_size: int | None = None) -> None:
    """The one check of a vocab map, wherever it is read (vocab_map.safetensors, a checkpoint, an export): every
    draft id maps to a distinct target id inside the target vocabulary, and t2d marks exactly those ids.
    Raises ValueError naming `where`."""
    vocab = len(t2d) if target_vocab_size is None else target_vocab_size
    ids = torch.arange(d2t.numel()) + d2t.to(torch.int64)  # what SGLang's hot_token_id will be
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= min(vocab, len(t2d))):
        raise ValueError(f"{where}: d2t maps draft ids outside the target vocabulary [0, {vocab})")
    if int(torch.unique(ids).numel()) != ids.numel():
        raise ValueError(f"{where}: d2t maps two draft ids to the same target id")
    if not bool(t2d.bool()[ids].all()) or int(t2d.bool().sum()) != d2t.numel():
        raise ValueError(f"{where}: d2t and t2d disagree: t2d does not mark exactly the target ids that d2t selects")
