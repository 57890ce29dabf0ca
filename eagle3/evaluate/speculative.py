"""Speculative greedy decoding with a transformers target and a draft method's drafter (eagle3/draft/method.py
Drafter), and plain greedy decoding of the same target: the decode loops the offline evaluation (offline.py) times
and counts. Batch 1; every method shares this verification, so each one's output is checked against greedy alike.

One verify round, after the target has emitted token x[n-1]: the draft chains k tokens on its own argmax, one
target forward over [x[n-1], d1..dk] gives g0..gk, the longest prefix with d_j == g_{j-1} is accepted and g_a
is the bonus token, the target's cache is cropped to the emitted tokens and the draft catches up on them.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from eagle3.draft.method import Drafter


# the target ---------------------------------------------------------------------------------------------------------
@dataclass
class Target:
    """A transformers causal LM decoded with its DynamicCache; `aux_layers` index its hidden_states."""

    model: Any
    aux_layers: list[int]
    stop_ids: frozenset[int]

    @property
    def device(self) -> torch.device:
        return torch.device(self.model.device)

    def forward(self, ids: Sequence[int], cache: Any, *, aux: bool, last_only: bool) -> tuple[Tensor, Tensor | None]:
        """Greedy tokens [m] (or [1] with last_only) after `ids` appended to `cache`; with aux, the aux hidden
        states [m, K, H] of those positions."""
        x = torch.tensor([list(ids)], dtype=torch.long, device=self.device)  # [1, m]
        out = self.model(
            input_ids=x, past_key_values=cache, use_cache=True, output_hidden_states=aux, logits_to_keep=int(last_only)
        )
        greedy = out.logits[0].argmax(-1)  # [m] or [1]
        states = torch.stack([out.hidden_states[i][0] for i in self.aux_layers], dim=1) if aux else None  # [m, K, H]
        return greedy, states

    def new_cache(self) -> Any:
        """An empty cache for one decode. A model with recurrent layers (linear attention, short convolutions,
        Mamba: Qwen3-Next, Qwen3.5, LFM2, Nemotron-H) needs the cache its config builds, with a state per such layer,
        and so does one with an attention indexer (DeepSeek-V3.2's sparse attention keeps its indexer's keys; those
        layers crop as plain ones do); any other model keeps the plain one (a full layer per decoder layer, which
        crops anywhere, where the config's may slide)."""
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicIndexedLayer

        cache = DynamicCache(config=self.model.config)
        indexed = any(isinstance(layer, DynamicIndexedLayer) for layer in cache.layers)
        return cache if is_recurrent(cache) or indexed else DynamicCache()


def is_recurrent(cache: Any) -> bool:
    """The cache holds a recurrent state, which `crop` cannot take back to an earlier token."""
    from transformers.cache_utils import LinearAttentionCacheLayerMixin

    return any(isinstance(layer, LinearAttentionCacheLayerMixin) for layer in cache.layers)


def sync(device: torch.device) -> None:
    """Wait for the device, so a wall-clock interval covers the work queued in it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class StepTimes:
    """Seconds spent in one kind of forward, and how many: the inputs of the modelled speed-up (offline.py)."""

    seconds: float = 0.0
    count: int = 0

    @property
    def mean(self) -> float:
        return self.seconds / self.count if self.count else 0.0

    def add(self, seconds: float, count: int = 1) -> None:
        self.seconds += seconds
        self.count += count


def greedy_decode(
    target: Target, prompt: Sequence[int], max_new_tokens: int, steps: StepTimes | None = None
) -> list[int]:
    """Plain greedy decoding with the KV cache: the reference output and the baseline speed. `steps` adds the time
    of every one-token decode forward (the prefill is not one)."""
    cache = target.new_cache()
    token, _ = target.forward(prompt, cache, aux=False, last_only=True)
    out = [int(token)]
    while len(out) < max_new_tokens and out[-1] not in target.stop_ids:
        t0 = time.perf_counter()
        token, _ = target.forward(out[-1:], cache, aux=False, last_only=True)
        out.append(int(token))  # int() waits for the device
        if steps is not None:
            steps.add(time.perf_counter() - t0)
    return out


# speculative decoding -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Round:
    drafted: int  # draft positions that count (fewer than k near the token budget or before a stop token)
    accepted: int  # of those, the accepted prefix; the round emitted accepted + 1 tokens


@dataclass
class Decoded:
    tokens: list[int]
    rounds: list[Round] = field(default_factory=list)
    draft: StepTimes = field(default_factory=StepTimes)  # per round: propose + catch up on the emitted tokens
    verify: StepTimes = field(default_factory=StepTimes)  # per round: the target's forward over [last, d1..dk]


def accepted_prefix(drafted: Sequence[int], greedy: Sequence[int]) -> int:
    """a such that drafted[:a] == greedy[:a] and drafted[a] != greedy[a] (greedy[j] is the target's token after
    drafted[:j], so drafted[j] is accepted when it equals greedy[j])."""
    a = 0
    while a < len(drafted) and drafted[a] == greedy[a]:
        a += 1
    return a


def verify(target: Target, last: int, drafted: list[int], cache: Any) -> tuple[list[int], Tensor]:
    """One target forward over [last, d1..dn]: greedy g0..gn and aux states [n+1, K, H] of those positions."""
    greedy, aux = target.forward([last, *drafted], cache, aux=True, last_only=False)
    assert aux is not None
    return greedy.tolist(), aux


def speculative_decode(
    target: Target, drafter: Drafter, prompt: Sequence[int], *, steps: int, max_new_tokens: int
) -> Decoded:
    """Greedy decoding by draft-and-verify rounds: the same tokens as greedy_decode, fewer target forwards.

    A target with recurrent layers (Target.new_cache) cannot crop the rejected drafts out of its state: each round
    verifies on a copy of the cache, and a round with rejections goes back to the copy and runs the accepted prefix
    again. The copy and that forward are timed in neither the draft's nor the verify's step (a server keeps the
    states of each drafted position instead)."""
    cache = target.new_cache()
    recurrent = is_recurrent(cache)
    first, aux = target.forward(prompt, cache, aux=True, last_only=True)  # prefill
    assert aux is not None
    out = Decoded([int(first)])
    drafter.start([*prompt, int(first)], aux)
    caught_up = 0.0  # the previous round's commit: drafting work of this round's draft
    while len(out.tokens) < max_new_tokens and out.tokens[-1] not in target.stop_ids:
        n = min(steps, max_new_tokens - len(out.tokens) - 1)
        t0 = time.perf_counter()
        drafted = drafter.propose(n) if n else []  # token ids: already on the host
        t1 = time.perf_counter()
        before = copy.deepcopy(cache) if recurrent else None  # timed in neither step (above)
        last = out.tokens[-1]
        tv = time.perf_counter()
        greedy, aux = verify(target, last, drafted, cache)  # .tolist() waits for the device
        out.draft.add(caught_up + t1 - t0)
        out.verify.add(time.perf_counter() - tv)
        caught_up = 0.0
        a = accepted_prefix(drafted, greedy)
        if n > a and before is None:
            cache.crop(-(n - a))  # rollback: keep [last, d1..da]
        elif n > a:
            cache = before  # the state before [last, d1..dn], then [last, d1..da] again
            target.forward([last, *drafted[:a]], cache, aux=False, last_only=True)
        new = [*drafted[:a], greedy[a]]
        stop = next((i for i, t in enumerate(new) if t in target.stop_ids), None)
        counted = n
        if stop is not None and stop < a:  # an accepted draft is a stop token: it ends the round as its last token
            new, a, counted = new[: stop + 1], stop, stop
        out.tokens.extend(new)
        out.rounds.append(Round(drafted=counted, accepted=a))
        if stop is None and len(out.tokens) < max_new_tokens:
            t2 = time.perf_counter()
            drafter.commit(new, aux[: len(new)])
            sync(target.device)
            caught_up = time.perf_counter() - t2
    return out
