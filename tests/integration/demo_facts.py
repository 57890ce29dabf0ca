"""The short conversations of the shared demo store (conftest.py demo_store) and the small training settings its
tests train with, and the store's build; test_grow_fp8_retrain.py builds its own store from the same facts."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from eagle3.config import PipelineConfig
from eagle3.convert.stage import convert
from eagle3.data.synthesize import synthesize
from eagle3.extract.engines.transformers_engine import TransformersEngine
from eagle3.extract.shard import extract_shard, open_run
from eagle3.store.run_store import RunStore

FACTS = ["Paris is the capital of France.", "Bees make honey.", "Three times four is twelve.",
         "Hola means hello in Spanish.", "The sky is blue.", "A cat sat on a mat."]  # fmt: skip
TRAIN = {"batch_tokens": 256, "ttt_steps": 2, "warmup_steps": 2, "draft_vocab_size": 512, "precision": "fp32",
         "log_every": 1, "checkpoint_every": 100, "loader_threads": 1, "prefetch_batches": 2}  # fmt: skip


def build_demo_store(root: Path, demo_model: Path) -> PipelineConfig:
    """A converted demo store under `root` (conftest.py demo_store; the end-to-end methods test builds its own)."""
    rows = [{"messages": [{"role": "user", "content": f"Tell me fact {i}."},
                          {"role": "assistant", "content": FACTS[i % len(FACTS)] + f" That is fact {i}."}]}
            for i in range(12)]  # fmt: skip
    (root / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = PipelineConfig.model_validate({
        "run_dir": str(root / "run"), "model": str(demo_model), "server": {"device": "cpu", "dtype": "float32"},
        "data": {"dataset": str(root / "data.jsonl"), "max_length": 128}, "train": TRAIN,
        "synthesize": {"max_new_tokens": 24, "batch_size": 12},
        "evaluate": {"dataset": str(root / "data.jsonl"), "num_prompts": 3, "max_new_tokens": 8, "draft_steps": 2},
    })  # fmt: skip
    store = RunStore(cfg.run_dir)
    threads = torch.get_num_threads()
    # float32 and one thread: the same answers and states on any CPU and core count (the golden curve trains on
    # them). In bf16, a CPU with native bf16 dot products (avx512_bf16) rounds otherwise than one without, greedy
    # answers flip at near-ties, and the curve moved by 8-16% from one machine to the next.
    torch.set_num_threads(1)
    try:
        synthesize(cfg, store, demo_model)
        engine = TransformersEngine(demo_model, device="cpu", dtype="float32", batch_tokens=512)
        info = open_run(cfg, store, demo_model, engine.info)
        assert extract_shard(store, 0, engine, info).status == "complete"
        convert(cfg, store, workers=1)
    finally:
        torch.set_num_threads(threads)
    return cfg
