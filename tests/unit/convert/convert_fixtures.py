"""Hand-made tiny stores for the convert tests (no model, no engine): H=16, K=3, a few samples."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import torch

from eagle3.store.run_store import (
    PREPARED_SCHEMA,
    PreparedManifest,
    RunInfo,
    RunStore,
    SampleEntry,
    ShardManifest,
)
from eagle3.store.sample_format import encode_sample, write_sample

NUM_LAYERS = 8
AUX_LAYERS = [2, 4, 5]  # HF indices: [2, N//2, N-3]


def make_store(
    root: Path,
    samples: list[tuple[list[int], list[int]]],
    *,
    hidden: int = 16,
    vocab: int = 64,
    shard_size: int = 2,
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
) -> RunStore:
    """A complete store: run.json, prepared shards + manifest, sample files + shard manifests."""
    store = RunStore(root)
    gen = torch.Generator().manual_seed(seed)
    shards = [samples[i : i + shard_size] for i in range(0, len(samples), shard_size)]
    for shard, rows in enumerate(shards):
        manifest = ShardManifest(shard=shard, status="complete", expected=len(rows))
        prepared: dict[str, list] = {name: [] for name in PREPARED_SCHEMA.names}
        for j, (ids, mask) in enumerate(rows):
            sid = f"s{shard:02d}-{j:03d}"
            t = len(ids)
            aux = torch.randn(t, len(AUX_LAYERS), hidden, generator=gen).to(dtype)  # [T, K, H]
            last = torch.randn(t, hidden, generator=gen).to(dtype)  # [T, H]
            data = encode_sample(sid, AUX_LAYERS, torch.tensor(ids), torch.tensor(mask), aux, last)
            rec = write_sample(store.sample_path(shard, sid), data)
            manifest.samples[sid] = SampleEntry(num_tokens=rec.num_tokens, num_bytes=rec.num_bytes, crc32=rec.crc32)
            for name, value in zip(PREPARED_SCHEMA.names, [sid, ids, mask, t, f"hand:{j}", "[]"], strict=True):
                prepared[name].append(value)
        store.write_manifest(manifest)
        store.write_prepared_shard(shard, pa.table(prepared, schema=PREPARED_SCHEMA))
    store.write_prepared_manifest(
        PreparedManifest(
            dataset="hand-made",
            dataset_fingerprint="f" * 64,
            tokenizer_sha256="t" * 64,
            num_samples=len(samples),
            num_tokens=sum(len(i) for i, _ in samples),
            num_loss_tokens=sum(sum(m) for _, m in samples),
            shards=[len(r) for r in shards],
            shard_tokens=[sum(len(i) for i, _ in r) for r in shards],
            config={},
        )
    )
    store.write_run_info(
        RunInfo(
            model_path="/models/tiny",
            model_sha256="m" * 64,
            tokenizer_sha256="t" * 64,
            engine="transformers",
            engine_version="test",
            dtype={torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}[dtype],
            hidden_size=hidden,
            num_layers=NUM_LAYERS,
            vocab_size=vocab,
            aux_layers=AUX_LAYERS,
            engine_layer_ids=AUX_LAYERS,
            engine_layer_convention="hf_hidden_states",
            dataset_fingerprint="f" * 64,
            versions={},
            config={},
        )
    )
    return store
