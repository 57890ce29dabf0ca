"""Synthetic runs in the exact store format, for the trainer's tests and the GPU benchmark.

`write_run` writes what the trainer reads: a target model directory (config.json + model.safetensors with
the embedding and lm_head), and a run directory (run.json, shards/shard-00000/<id>.safetensors through the
store's own writer, index.arrow, vocab_map.safetensors). `learnable` makes the target's next token a fixed
function of the current one, so a draft can learn it from the token embedding alone (tests: loss falls,
accuracy rises); otherwise the hidden states are random (benchmark: only shapes and bytes matter).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save

from eagle3.convert.index import IndexRow, write_index
from eagle3.convert.vocab import VOCAB_FORMAT
from eagle3.store.fsio import atomic_write_bytes, atomic_write_json
from eagle3.store.run_store import RunInfo, RunStore
from eagle3.store.sample_format import FP8_NAME, encode_sample, quantize_fp8, write_sample


@dataclass(frozen=True)
class SyntheticSpec:
    hidden_size: int = 32
    intermediate_size: int = 64
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int | None = None
    vocab_size: int = 128
    draft_vocab_size: int = 96
    num_layers: int = 8
    aux_layers: tuple[int, ...] = (2, 4, 5)
    lengths: tuple[int, ...] = (24, 40, 33, 17, 48, 29, 36, 21)
    rope: dict[str, Any] | None = None  # rope_parameters; None: default with theta 10000
    dtype: torch.dtype = torch.bfloat16
    learnable: bool = True
    seed: int = 0
    store_dtype: str = "bfloat16"  # or "float8_e4m3": the states quantized as extraction would (quantize_fp8)


def target_config(spec: SyntheticSpec) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim or spec.hidden_size // spec.num_heads,
        "num_hidden_layers": spec.num_layers,
        "vocab_size": spec.vocab_size,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 131072,
        "rope_parameters": spec.rope or {"rope_theta": 10000.0, "rope_type": "default"},
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
    }


def write_target_model(model_dir: Path, spec: SyntheticSpec, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """config.json + model.safetensors (embedding, lm_head); returns (embedding, lm_head) on the CPU."""
    g = torch.Generator(device=device).manual_seed(spec.seed)
    v, h = spec.vocab_size, spec.hidden_size
    embed = torch.randn(v, h, generator=g, device=device).to(spec.dtype).cpu()
    head = torch.randn(v, h, generator=g, device=device).to(spec.dtype).cpu() / h**0.5
    model_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(model_dir / "config.json", target_config(spec))
    atomic_write_bytes(
        model_dir / "model.safetensors", save({"model.embed_tokens.weight": embed, "lm_head.weight": head})
    )
    return embed, head


def write_run(run_dir: Path, model_dir: Path, spec: SyntheticSpec, device: str = "cpu", threads: int = 8) -> list[Path]:
    """A complete synthetic run (target model, store, index, vocab map); returns the sample paths."""
    embed, head = write_target_model(model_dir, spec, device)
    run_dir.mkdir(parents=True, exist_ok=True)
    store = RunStore(run_dir)
    g = torch.Generator().manual_seed(spec.seed + 1)
    v, h, k = spec.vocab_size, spec.hidden_size, len(spec.aux_layers)
    used = torch.randperm(v, generator=g)[: spec.draft_vocab_size].sort().values  # the draft vocabulary
    successor = dict(zip(used.tolist(), used[torch.randperm(len(used), generator=g)].tolist(), strict=True))
    proj = torch.randn(k, h, h, generator=g) / h**0.5
    pool = None if spec.learnable else torch.randn(max(spec.lengths) + 257, k + 1, h, generator=g).to(spec.dtype)

    def sample(j: int, t: int) -> bytes:
        gj = torch.Generator().manual_seed(spec.seed * 7919 + j)
        draws = used[torch.randint(len(used), (t,), generator=gj)].tolist()
        ids = draws[:1]
        if spec.learnable:  # mostly follow the successor rule, sometimes jump
            jumps = (torch.rand(t, generator=gj) < 0.1).tolist()
            for d, jump in zip(draws[1:], jumps[1:], strict=True):
                ids.append(d if jump else successor[ids[-1]])
        else:
            ids = draws
        x = torch.tensor(ids)
        loss_mask = (torch.arange(t) >= t // 4).to(torch.uint8)  # a "prompt" quarter without loss
        if spec.learnable:
            e = embed[x].float()  # [T, H]
            aux = torch.stack([e @ proj[i] for i in range(k)], 1).to(spec.dtype)  # [T, K, H]
            nxt = torch.tensor([successor[i] for i in ids])
            last = (4.0 * head[nxt].float() * h**0.5).to(spec.dtype)  # target argmax at t: successor(x[t])
        else:
            off = j % 257
            aux, last = pool[off : off + t, :k], pool[off : off + t, k]  # type: ignore[index]
        if spec.store_dtype == FP8_NAME:
            (qa, sa), (ql, sl) = quantize_fp8(aux), quantize_fp8(last)
            return encode_sample(f"s{j:06d}", list(spec.aux_layers), x, loss_mask, qa, ql, sa, sl)
        return encode_sample(f"s{j:06d}", list(spec.aux_layers), x, loss_mask, aux, last)

    rows = []
    shard_dir = store.shard_dir(0)
    shard_dir.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(threads) as pool_ex:
        datas = pool_ex.map(lambda jt: sample(*jt), enumerate(spec.lengths))
        for j, (t, data) in enumerate(zip(spec.lengths, datas, strict=True)):
            sid = f"s{j:06d}"
            write_sample(store.sample_path(0, sid), data)
            rows.append(IndexRow(0, sid, str(store.sample_path(0, sid).relative_to(run_dir)), t, t - t // 4))

    info = RunInfo(
        model_path=str(model_dir),
        model_sha256="synthetic",
        tokenizer_sha256="synthetic",
        engine="synthetic",
        engine_version="0",
        dtype={torch.bfloat16: "bfloat16", torch.float32: "float32"}[spec.dtype],
        store_dtype=FP8_NAME if spec.store_dtype == FP8_NAME else "",
        hidden_size=h,
        num_layers=spec.num_layers,
        vocab_size=v,
        aux_layers=list(spec.aux_layers),
        engine_layer_ids=list(spec.aux_layers),
        engine_layer_convention="hf",
        dataset_fingerprint="synthetic",
        versions={"torch": torch.__version__},
        config={},
    )
    store.write_run_info(info)
    write_index(store.index_path, rows, "synthetic")
    d2t = used - torch.arange(len(used))
    t2d = torch.zeros(v, dtype=torch.bool)
    t2d[used] = True
    meta = {"format": VOCAB_FORMAT, "draft_vocab_size": str(len(used)), "target_vocab_size": str(v)}
    atomic_write_bytes(store.vocab_map_path, save({"d2t": d2t, "t2d": t2d}, metadata=meta))
    return [run_dir / r.path for r in rows]
