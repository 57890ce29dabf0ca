"""Tiny hand-made stores for fault tests: prepared shards, run.json and a model-free engine (H = 8..64)."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pyarrow as pa
import torch

from eagle3.extract.engines.base import Captured, EngineInfo, Failed, Outcome
from eagle3.store.run_store import PREPARED_SCHEMA, PreparedManifest, PreparedSample, RunInfo, RunStore

AUX = [1, 2, 3]


def run_info(hidden_size: int = 8, **kw: object) -> RunInfo:
    fields: dict = dict(
        model_path="m", model_sha256="a" * 64, tokenizer_sha256="b" * 64, engine="scripted",
        engine_version="0", dtype="bfloat16", hidden_size=hidden_size, num_layers=6, vocab_size=1000,
        aux_layers=AUX, engine_layer_ids=AUX, engine_layer_convention="hf_hidden_states",
        dataset_fingerprint="d", versions={}, config={},
    )  # fmt: skip
    fields.update(kw)
    return RunInfo(**fields)


def make_store(
    root: Path, shards: Sequence[Sequence[int]], hidden_size: int = 8, max_length: int = 2048
) -> tuple[RunStore, RunInfo]:
    """A store whose shard i holds samples of the token counts shards[i]; ids are "s<shard>-<n>"."""
    store = RunStore(root)
    for i, lengths in enumerate(shards):
        rows = [
            {"sample_id": f"s{i}-{n:03d}", "input_ids": [(7 * n + j) % 1000 for j in range(t)],
             "loss_mask": [j % 2 for j in range(t)], "num_tokens": t, "source": f"test:{n}", "messages": "[]"}
            for n, t in enumerate(lengths)
        ]  # fmt: skip
        store.write_prepared_shard(i, pa.Table.from_pylist(rows, schema=PREPARED_SCHEMA))
    store.write_prepared_manifest(
        PreparedManifest(
            dataset="test",
            dataset_fingerprint="d",
            tokenizer_sha256="b" * 64,
            num_samples=sum(len(s) for s in shards),
            num_tokens=sum(sum(s) for s in shards),
            num_loss_tokens=0,
            shards=[len(s) for s in shards],
            shard_tokens=[sum(s) for s in shards],
            config={"max_length": max_length},
        )
    )
    info = run_info(hidden_size)
    store.write_run_info(info)
    return store, info


def hidden(sample: PreparedSample, info: RunInfo) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic per-sample hidden states: the same sample always gives the same bytes."""
    g = torch.Generator().manual_seed(zlib.crc32(sample.sample_id.encode()))
    t, k, h = len(sample), len(info.aux_layers), info.hidden_size
    aux = torch.randn(t, k, h, generator=g).to(torch.bfloat16)  # [T, K, H]
    last = torch.randn(t, h, generator=g).to(torch.bfloat16)  # [T, H]
    return aux, last


class ScriptedEngine:
    """No model: captures deterministic tensors; `fail` samples yield Failed; `before(i, sample)` runs
    before the i-th outcome (fault injection: fill the disk, raise, sleep)."""

    def __init__(
        self,
        info: RunInfo,
        fail: Sequence[str] = (),
        before: Callable[[int, PreparedSample], None] | None = None,
    ):
        self.run_info = info
        self.info = EngineInfo("scripted", "0", list(info.aux_layers), list(info.aux_layers), "hf_hidden_states")
        self.fail, self.before = set(fail), before
        self.calls: list[list[str]] = []

    def extract(self, samples: Sequence[PreparedSample]) -> Iterator[Outcome]:
        self.calls.append([s.sample_id for s in samples])
        for i, s in enumerate(samples):
            if self.before is not None:
                self.before(i, s)
            if s.sample_id in self.fail:
                yield Failed(s, "injected failure for the test")
            else:
                yield Captured(s, *hidden(s, self.run_info))

    def close(self) -> None:
        pass
