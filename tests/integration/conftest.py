"""Built once per session, on first use:

plain_server  one plain SGLang server of the demo model (bf16, no hidden-state hook), shared by tests that only
              send it requests: the prompts stage with multi-sample synthesize, the live measurement. An SGLang
              start costs about a minute of both cores here; tests that kill, hang or reconfigure a server, or
              compare greedy outputs across runs (bf16 numerics depend on batching), start their own.
demo_store    a converted float32 demo store the target wrote itself (synthesize, extract, convert: ~10 s), shared by
              the retraining tests and the golden curve (test_retrain.py, test_golden_curve.py); they train into
              directories of their own and leave its samples as they are.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from eagle3.config import PipelineConfig
from eagle3.convert.stage import convert
from eagle3.data.synthesize import synthesize
from eagle3.extract.engines.transformers_engine import TransformersEngine
from eagle3.extract.shard import extract_shard, open_run
from eagle3.serving.server import SGLangServer
from eagle3.store.run_store import RunStore
from tests.integration.demo_facts import FACTS, TRAIN
from tests.integration.sglang_support import plain_server_at


@pytest.fixture(scope="session")
def plain_server(tmp_path_factory: pytest.TempPathFactory, demo_model: Path) -> Iterator[SGLangServer]:
    with plain_server_at(tmp_path_factory.mktemp("plain-server"), demo_model) as server:
        yield server


@pytest.fixture(scope="session")
def demo_store(tmp_path_factory: pytest.TempPathFactory, demo_model: Path) -> PipelineConfig:
    """A converted demo store of twelve short conversations whose answers the target wrote itself (synthesize,
    greedy), so a trained draft can learn what the target says; the evaluation set is its first three prompts."""
    root = tmp_path_factory.mktemp("demo-store")
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
