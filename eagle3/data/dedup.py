"""Near-duplicate prompts: Jaccard similarity of word n-gram shingles over normalized text (no MinHash: exact,
cheap at corpus-of-prompts sizes, and deterministic).

    normalize("Write a POEM, about cats!")         -> "write a poem about cats"
    shingles(text, n=3)                            -> {"write a poem", "a poem about", "poem about cats"}
    NearDuplicates(n=3, threshold=0.7)             an index; .match(text) -> the first kept text it nearly equals
    dedup(texts, n, threshold, against=...)        -> (kept indices, dropped: index -> why)

Two texts are near-duplicates when the Jaccard similarity of their shingle sets is >= threshold, or when their
normalized texts are equal (short texts, fewer words than n, compare as one shingle). Candidates are found
through an inverted index on each set's prefix (the prefix filter of exact set-similarity joins): under one fixed
order of shingles, two sets with Jaccard >= t share a shingle among the first |s| - ceil(t |s|) + 1 of each, so
only those are indexed and probed. `dedup` orders shingles rarest first, so the shingles every prompt shares ("can
you please") are rarely in a prefix and no longer make each text a candidate of every other. The result is the
exhaustive comparison's (tests/unit/data/test_prompt_gen.py checks it against one).
"""

from __future__ import annotations

import math
import re
import unicodedata
import zlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

_WORD = re.compile(r"[^\W_]+", re.UNICODE)


def normalize(text: str) -> str:
    """Lower case, NFKC, words only (punctuation and whitespace runs become one space)."""
    return " ".join(_WORD.findall(unicodedata.normalize("NFKC", text).casefold()))


def shingles(text: str, n: int) -> frozenset[str]:
    """The word n-grams of normalize(text); a text of fewer than n words is one shingle (itself)."""
    words = normalize(text).split()
    if len(words) < n:
        return frozenset([" ".join(words)]) if words else frozenset()
    return frozenset(" ".join(words[i : i + n]) for i in range(len(words) - n + 1))


def prefix(s: frozenset[str], threshold: float, frequency: Mapping[str, int]) -> list[str]:
    """The shingles of `s` that any set with Jaccard >= threshold must share one of: the first
    |s| - ceil(threshold |s|) + 1 in one fixed order, rarest first (`frequency`; unknown ones count 0), then by a
    hash, so that shingles of equal counts fall anywhere."""
    need = math.ceil(round(threshold * len(s), 9))  # rounded: 0.7 * 10 is 7.000000000000001 in floats
    ordered = sorted(s, key=lambda sh: (frequency.get(sh, 0), zlib.crc32(sh.encode()), sh))
    return ordered[: len(s) - max(need, 1) + 1]


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


@dataclass
class NearDuplicates:
    """An index of texts; `match` finds a kept text that a new one nearly equals. `frequency` (shingle -> count
    over the texts to come) only speeds it up; it must not change while the index is used."""

    n: int = 3
    threshold: float = 0.7
    frequency: Mapping[str, int] = field(default_factory=dict)
    _sets: list[frozenset[str]] = field(default_factory=list)
    _labels: list[str] = field(default_factory=list)
    _by_shingle: dict[str, list[int]] = field(default_factory=dict)

    def add(self, text: str, label: str) -> None:
        s = shingles(text, self.n)
        i = len(self._sets)
        self._sets.append(s)
        self._labels.append(label)
        for sh in prefix(s, self.threshold, self.frequency):
            self._by_shingle.setdefault(sh, []).append(i)

    def match(self, text: str) -> tuple[str, float] | None:
        """(label of the most similar indexed text, similarity) when it is >= threshold, else None."""
        s = shingles(text, self.n)
        candidates = {i for sh in prefix(s, self.threshold, self.frequency) for i in self._by_shingle.get(sh, ())}
        best: tuple[str, float] | None = None
        for i in sorted(candidates):
            sim = jaccard(s, self._sets[i])
            if sim >= self.threshold and (best is None or sim > best[1]):
                best = (self._labels[i], sim)
        return best


def dedup(
    texts: Sequence[str],
    n: int = 3,
    threshold: float = 0.7,
    *,
    against: Iterable[tuple[str, str]] = (),
) -> tuple[list[int], dict[int, str]]:
    """Keep the first of each group of near-duplicate texts, in order; drop any text near one of `against`
    ((label, text) pairs, e.g. evaluation prompts that training must not contain). Returns the kept indices and,
    for each dropped index, the reason (what it nearly equals)."""
    against = list(against)
    frequency = Counter(sh for text in [*texts, *(t for _, t in against)] for sh in shingles(text, n))
    blocked = NearDuplicates(n, threshold, frequency)
    for label, text in against:
        blocked.add(text, label)
    kept_index = NearDuplicates(n, threshold, frequency)
    kept: list[int] = []
    dropped: dict[int, str] = {}
    for i, text in enumerate(texts):
        hit = blocked.match(text)
        if hit is not None:
            dropped[i] = f"near {hit[0]} (similarity {hit[1]:.2f})"
            continue
        hit = kept_index.match(text)
        if hit is not None:
            dropped[i] = f"near-duplicate of prompt {hit[0]} (similarity {hit[1]:.2f})"
            continue
        kept_index.add(text, str(i))
        kept.append(i)
    return kept, dropped
