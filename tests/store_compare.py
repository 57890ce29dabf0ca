"""What "the same store" means when comparing runs of one dataset (tests of scale-out and resume).

`store_contents` reduces a run directory to what a reader of the store sees: per shard, the manifest's status,
expected count, errors and per-sample entries (token count, bytes, crc32), and per sample the sha256 of its file
(header, ids, mask and hidden states: one changed bit changes it). Timestamps (`updated_at`, run.json's
`created_at`) and run.json's config (which names the servers) are left out on purpose.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch

from eagle3.store.run_store import RunStore
from eagle3.store.sample_format import read_sample


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def store_contents(store: RunStore) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for m in store.manifests():
        files = {sid: digest(store.sample_path(m.shard, sid)) for sid in sorted(m.samples)}
        entries = {sid: e.model_dump() for sid, e in sorted(m.samples.items())}
        out[m.shard] = {
            "status": m.status,
            "expected": m.expected,
            "errors": dict(m.errors),
            "samples": entries,
            "tokens": m.tokens,
            "bytes": m.bytes,
            "files": files,
        }
    return out


def max_state_difference(a: RunStore, b: RunStore) -> float:
    """The largest absolute difference of any hidden state between two stores of the same samples (ids and masks
    must be equal, else AssertionError)."""
    worst = 0.0
    for m in a.manifests():
        for sid in m.samples:
            x, y = read_sample(a.sample_path(m.shard, sid)), read_sample(b.sample_path(m.shard, sid))
            assert torch.equal(x.input_ids, y.input_ids) and torch.equal(x.loss_mask, y.loss_mask), sid
            for key in ("aux_hidden_states", "last_hidden_state"):
                d = (getattr(x, key).float() - getattr(y, key).float()).abs().max().item()
                worst = max(worst, d)
    return worst
