"""The store the peers bench trains on: `make demo`'s (configs/demo.yaml: the demo target's own answers to 200
prompts, extracted), built here with the library's stages, once per root.

    cfg = demo_store(root, ["train.max_steps=24", ...])   # <root>/run; ~3-5 min on 2 CPU cores the first time

The evaluation sets are demo.yaml's (varied, HumanEval, template held-out: prompts the store never saw);
train.heldout_fraction keeps a slice of the store's prompts out of training for the held-out loss.
"""

from __future__ import annotations

from pathlib import Path

import torch

from eagle3.config import PipelineConfig
from eagle3.config.load import load_config
from eagle3.convert.stage import convert
from eagle3.data.synthesize import synthesize
from eagle3.extract.engines.transformers_engine import TransformersEngine
from eagle3.extract.shard import extract_shard, open_run
from eagle3.store.run_store import RunStore
from eagle3.target.demo import ensure_demo_model

REPO = Path(__file__).resolve().parents[2]


def demo_store(root: Path, overrides: list[str] | None = None) -> PipelineConfig:
    """configs/demo.yaml with run_dir = <root>/run and `overrides`; synthesize, extract and convert unless done."""
    model = ensure_demo_model(REPO / "data")
    cfg = load_config(REPO / "configs" / "demo.yaml", [f"run_dir={root / 'run'}", f"model={model}", *(overrides or [])])
    store = RunStore(cfg.run_dir)
    if store.vocab_map_path.is_file():
        return cfg
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same bf16 numerics on any core count (tests/integration/conftest.py)
    try:
        synthesize(cfg, store, model)
        engine = TransformersEngine(model, device="cpu", dtype=cfg.server.dtype, batch_tokens=cfg.server.batch_tokens)
        info = open_run(cfg, store, model, engine.info)
        for shard in range(store.num_shards()):
            assert extract_shard(store, shard, engine, info).status == "complete"
        convert(cfg, store, workers=1)
    finally:
        torch.set_num_threads(threads)
    return cfg
