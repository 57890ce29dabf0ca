"""The premise of preflight's sparse_attention_problems, on the tiny DeepSeek-V3.2 with its indexer keeping 8 keys
instead of 2,048: transformers 5.19's prefill is causal while a sample fits index_topk, and not past it (a token's
logits change with later tokens). A server's prefill cannot depend on tokens it has not seen. When this fails because
the prefill is causal, transformers fixed its indexer: drop the refusal (eagle3/checks/preflight.py) and this test."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

TOPK = 8


@pytest.fixture(scope="module")
def v32(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> object:
    from transformers import AutoModelForCausalLM

    d = tmp_path_factory.mktemp("v32") / "model"
    shutil.copytree(tiny_models["DeepseekV32ForCausalLM"], d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "index_topk": TOPK}))
    return AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()


@torch.no_grad()
def test_transformers_deepseek_v32_prefill_is_causal_within_index_topk_and_not_past_it(v32: object) -> None:
    ids = torch.arange(100, 120).unsqueeze(0)  # 20 tokens
    full = v32(ids).logits[0]  # type: ignore[operator]
    prefix = [v32(ids[:, : t + 1]).logits[0, -1] for t in range(ids.shape[1])]  # type: ignore[operator]
    change = [float((prefix[t] - full[t]).abs().max()) for t in range(ids.shape[1])]
    assert max(change[:TOPK]) < 1e-4, change  # within index_topk: later tokens change nothing
    assert max(change[TOPK:-1]) > 1e-2, change  # past it: a token's logits depend on tokens after it

