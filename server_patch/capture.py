"""Which rows of a forward belong to which request, and stitching chunked prefill back together.

Pure bookkeeping over plain lists (no SGLang import), so it is unit-tested in the pipeline's venv.

SGLang lays out an EXTEND/MIXED batch as the requests of `batch.reqs` in order, request i taking
`extend_lens[i]` consecutive rows that start at prompt position `prefix_lens[i]`:

    rows:  [ req0: prefix0 .. prefix0+ext0 ) [ req1: ... ) ... [ decode tails of a MIXED batch: 1 row each )

A request is captured only when its rid has the pipeline's prefix. Rows at or beyond the prompt length
(decode tails, a retracted request's generated tokens) are dropped. Chunked prefill sends one request
over several forwards: chunk n starts where chunk n-1 ended; the request is complete when its rows
reach the prompt length. A first chunk that starts after position 0 means the radix cache served the
prefix (those rows are never computed), which is an error for this request, never silent data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Segment:
    """The rows of one captured request inside one forward."""

    rid: str
    row_start: int  # first row in the forward's output
    num_rows: int  # rows kept (capped at the prompt length)
    position: int  # prompt position of the first kept row (the request's prefix length)
    prompt_len: int


@dataclass(frozen=True)
class BatchPlan:
    segments: list[Segment]
    total_rows: int  # rows the forward must have produced (sum of extend lengths)
    errors: dict[str, str]  # rid -> reason, for captured requests whose rows cannot be trusted


def plan_batch(
    rids: list[str],
    extend_lens: list[int],
    prefix_lens: list[int],
    prompt_lens: list[int],
    rid_prefix: str,
) -> BatchPlan:
    """Map each captured request of an EXTEND/MIXED batch to its rows."""
    errors: dict[str, str] = {}
    if not len(rids) == len(extend_lens) == len(prefix_lens) == len(prompt_lens):
        reason = (
            f"batch bookkeeping disagrees: {len(rids)} requests, {len(extend_lens)} extend lengths, "
            f"{len(prefix_lens)} prefix lengths"
        )
        return BatchPlan([], -1, {r: reason for r in rids if r.startswith(rid_prefix)})
    segments = []
    row = 0
    for rid, ext, pre, plen in zip(rids, extend_lens, prefix_lens, prompt_lens, strict=True):
        if rid.startswith(rid_prefix):
            keep = max(0, min(ext, plen - pre))
            if keep:
                segments.append(Segment(rid, row, keep, pre, plen))
        row += ext
    return BatchPlan(segments, row, errors)


@dataclass
class _Partial:
    next_position: int
    prompt_len: int
    chunks: list[Any] = field(default_factory=list)
    age: int = 0  # forwards since the last chunk arrived


@dataclass(frozen=True)
class Complete:
    rid: str
    chunks: list[Any]  # in prompt order; together they cover positions 0..prompt_len


@dataclass(frozen=True)
class Broken:
    rid: str
    reason: str


class Stitcher:
    """Collects a request's chunks until its rows cover the whole prompt.

    `max_partial` bounds the requests held half-done (an aborted request never completes); the one
    waited on longest is given up with a reason when a new one would exceed it.
    """

    def __init__(self, max_partial: int = 256):
        self.max_partial = max_partial
        self._partial: dict[str, _Partial] = {}

    def __len__(self) -> int:
        return len(self._partial)

    def add(self, seg: Segment, chunk: Any) -> list[Complete | Broken]:
        out: list[Complete | Broken] = []
        p = self._partial.get(seg.rid)
        if seg.position == 0:
            # A fresh prefill (or a retracted request prefilled again from the start): start over.
            p = _Partial(next_position=0, prompt_len=seg.prompt_len)
            self._partial[seg.rid] = p
        elif p is None:
            return [
                Broken(
                    seg.rid,
                    f"the first computed row is prompt position {seg.position}, not 0: positions "
                    f"0..{seg.position - 1} came from the prefix (radix) cache and were never computed; "
                    "launch SGLang with --disable-radix-cache",
                )
            ]
        elif seg.position != p.next_position or seg.prompt_len != p.prompt_len:
            del self._partial[seg.rid]
            return [
                Broken(
                    seg.rid,
                    f"chunked prefill out of order: a chunk starts at position {seg.position}, the previous "
                    f"one ended at {p.next_position} (prompt length {seg.prompt_len} vs {p.prompt_len})",
                )
            ]
        p.chunks.append(chunk)
        p.next_position = seg.position + seg.num_rows
        p.age = 0
        if p.next_position >= p.prompt_len:
            del self._partial[seg.rid]
            out.append(Complete(seg.rid, p.chunks))
        while len(self._partial) > self.max_partial:
            oldest = max(self._partial, key=lambda r: self._partial[r].age)
            q = self._partial.pop(oldest)
            out.append(Broken(oldest, f"gave up after {q.age} forwards with {q.next_position}/{q.prompt_len} rows"))
        return out

    def tick(self) -> None:
        """Call once per forward: ages the half-done requests."""
        for p in self._partial.values():
            p.age += 1

    def drop(self, rid: str) -> None:
        self._partial.pop(rid, None)
