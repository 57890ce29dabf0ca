"""Speculative greedy decoding with a transformers target and an EAGLE-3 drafter, and plain greedy decoding
of the same target: the decode loops the offline evaluation (offline.py) times and counts. Batch 1.

One verify round, after the target has emitted token x[n-1]: the draft chains k tokens on its own argmax, one
target forward over [x[n-1], d1..dk] gives g0..gk, the longest prefix with d_j == g_{j-1} is accepted and g_a
is the bonus token, the target's cache is cropped to the emitted tokens and the draft catches up on them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor

from eagle3.draft.model import Eagle3Draft, rope_cos_sin


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


def greedy_decode(target: Target, prompt: Sequence[int], max_new_tokens: int) -> list[int]:
    """Plain greedy decoding with the KV cache: the reference output and the baseline speed."""
    from transformers import DynamicCache

    cache = DynamicCache()
    token, _ = target.forward(prompt, cache, aux=False, last_only=True)
    out = [int(token)]
    while len(out) < max_new_tokens and out[-1] not in target.stop_ids:
        token, _ = target.forward(out[-1:], cache, aux=False, last_only=True)
        out.append(int(token))
    return out


# drafters -----------------------------------------------------------------------------------------------------------
class Drafter(Protocol):
    """What speculative decoding needs of a draft. Positions are absolute; tokens are target ids."""

    def start(self, tokens: list[int], aux: Tensor) -> None:
        """The prompt and the target's first token, x[0..n-1]; aux [n-1, K, H] of positions 0..n-2."""

    def propose(self, n: int) -> list[int]:
        """n drafted tokens for positions n.. (after the last committed token)."""
        ...

    def commit(self, tokens: list[int], aux: Tensor) -> None:
        """Tokens emitted by a round; aux [len(tokens), K, H] of the positions before each of them."""


class DraftKV:
    """The draft's key/value cache: step-0 entries of the committed positions, then a chain's entries while
    it is drafted. `attend` is the model's AttendFn: new queries see every cached key and the new ones causally."""

    def __init__(self) -> None:
        self.k: Tensor | None = None  # [L, nkv, hd]
        self.v: Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.shape[0]

    def crop(self, length: int) -> None:
        if self.k is not None and self.v is not None:
            self.k, self.v = self.k[:length], self.v[:length]

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        past = len(self)
        self.k = k if self.k is None else torch.cat([self.k, k])  # [past + m, nkv, hd]
        self.v = v if self.v is None else torch.cat([self.v, v])
        m, nh, hd = q.shape
        g = nh // k.shape[1]
        keys, values = self.k.repeat_interleave(g, dim=1), self.v.repeat_interleave(g, dim=1)  # [L, nh, hd]
        s = torch.einsum("qhd,khd->hqk", q.float(), keys.float()) / math.sqrt(hd)  # [nh, m, L]
        allowed = torch.arange(past + m, device=q.device)[None, :] <= past + torch.arange(m, device=q.device)[:, None]
        s = s.masked_fill(~allowed, float("-inf"))
        out = torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), values.float())  # [m, nh, hd]
        return out.to(q.dtype), torch.logsumexp(s, dim=-1).transpose(0, 1)


class EagleDrafter:
    """The EAGLE-3 draft decoding a chain, with the same inputs as training's TTT (eagle3/draft/model.py):
    step 0 at position t takes (embedding of x[t+1], fc(aux[t])) at RoPE position t; chain step i takes the
    embedding of its previous draft token and the previous step's pre-norm hidden state at RoPE position t+i."""

    def __init__(self, draft: Eagle3Draft):
        self.draft = draft
        self.dtype = draft.fc.weight.dtype
        self.kv = DraftKV()
        self.pos = -1  # last position with a step-0 entry
        self.hidden: Tensor | None = None  # [1, H] step-0 output there: predicts the next token

    def _layer(self, tokens: Tensor, hidden: Tensor, positions: Tensor) -> Tensor:
        d = self.draft
        cos, sin = rope_cos_sin(d.inv_freq, positions)  # [m, 1, hd]
        return d.midlayer(d.embed_tokens(tokens), hidden, cos, sin, [], self.kv.attend)  # [m, H]

    def start(self, tokens: list[int], aux: Tensor) -> None:
        self.kv, self.pos = DraftKV(), -1
        self.commit(tokens[1:], aux)

    def commit(self, tokens: list[int], aux: Tensor) -> None:
        dev = self.draft.fc.weight.device
        m = len(tokens)
        positions = torch.arange(self.pos + 1, self.pos + 1 + m, device=dev)
        hidden = self.draft.fc(aux.to(dev, self.dtype).flatten(1))  # [m, H]
        ids = torch.tensor(tokens, dtype=torch.long, device=dev)  # x[t+1] for t in positions
        self.hidden = self._layer(ids, hidden, positions)[-1:]  # [1, H]
        self.pos += m

    def chain(self, n: int) -> list[Tensor]:
        """Logits [draft vocab] of n chained steps from the last committed position, each step fed the previous
        step's argmax; the cache is left as it was."""
        assert self.hidden is not None, "chain before start"
        d, keep, h = self.draft, len(self.kv), self.hidden
        logits: list[Tensor] = []
        for i in range(n):
            logits.append(d.lm_head(d.norm(h))[0])  # [draft vocab]
            if i + 1 < n:
                draft_id = int(logits[-1].argmax())
                ids = (d.d2t[draft_id] + draft_id).view(1)  # draft id -> target id
                h = self._layer(ids, h, torch.tensor([self.pos + 1 + i], device=h.device))
        self.kv.crop(keep)  # chain entries are discarded; the accepted tokens come back through commit
        return logits

    def propose(self, n: int) -> list[int]:
        ids = [int(x.argmax()) for x in self.chain(n)]
        return [i + int(self.draft.d2t[i]) for i in ids]


# speculative decoding -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Round:
    drafted: int  # draft positions that count (fewer than k near the token budget or before a stop token)
    accepted: int  # of those, the accepted prefix; the round emitted accepted + 1 tokens


@dataclass
class Decoded:
    tokens: list[int]
    rounds: list[Round] = field(default_factory=list)


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
    """Greedy decoding by draft-and-verify rounds: the same tokens as greedy_decode, fewer target forwards."""
    from transformers import DynamicCache

    cache = DynamicCache()
    first, aux = target.forward(prompt, cache, aux=True, last_only=True)  # prefill
    assert aux is not None
    out = Decoded([int(first)])
    drafter.start([*prompt, int(first)], aux)
    while len(out.tokens) < max_new_tokens and out.tokens[-1] not in target.stop_ids:
        n = min(steps, max_new_tokens - len(out.tokens) - 1)
        drafted = drafter.propose(n) if n else []
        greedy, aux = verify(target, out.tokens[-1], drafted, cache)
        a = accepted_prefix(drafted, greedy)
        if n > a:
            cache.crop(-(n - a))  # rollback: keep [last, d1..da]
        new = [*drafted[:a], greedy[a]]
        stop = next((i for i, t in enumerate(new) if t in target.stop_ids), None)
        counted = n
        if stop is not None and stop < a:  # an accepted draft is a stop token: it ends the round as its last token
            new, a, counted = new[: stop + 1], stop, stop
        out.tokens.extend(new)
        out.rounds.append(Round(drafted=counted, accepted=a))
        if stop is None and len(out.tokens) < max_new_tokens:
            drafter.commit(new, aux[: len(new)])
    return out
