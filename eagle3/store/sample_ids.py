"""Ids of generated samples: the synthesize stage writes a source sample's k-th answer as `<source id>.s<k>` (the
first keeps the source's id), and the held-out split (eagle3/draft/heldout.py) keeps every answer to one source on
one side, so a held-out prompt is never trained on through another answer to it."""

from __future__ import annotations

import re

_ANSWER_SUFFIX = re.compile(r"\.s[1-9][0-9]*$")


def sample_keys(source_id: str, samples_per_prompt: int) -> list[str]:
    """The ids of a source sample's generated samples: its id, then `<id>.s1`, `<id>.s2`, ..."""
    return [source_id, *(f"{source_id}.s{k}" for k in range(1, samples_per_prompt))]


def source_of(sample_id: str) -> str:
    """The source sample's id of a generated sample (`<id>.s<k>` -> `<id>`); any other id is its own source."""
    return _ANSWER_SUFFIX.sub("", sample_id)
