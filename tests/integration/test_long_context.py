"""A long agentic conversation (about 8.5K tokens of tool calls and results, on the tiny Qwen3 with a 16K context and a
Qwen3-style template) through prepare -> extract (transformers engine) -> convert -> train -> export: prepared
whole, captured whole, trained whole in a longer step (train.batch_tokens is 1,024) with extraction's and training's
memory bounded, and the exported draft's max_position_embeddings covers it. The same run at 2K-32K tokens is
bench/long_context_bench.py (docs/performance.md, long samples)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3.config import PipelineConfig
from eagle3.data.prepare import prepare
from eagle3.store.run_store import RunStore
from tests.long_samples import QWEN3_TOOLS, long_conversation, run_long_sample, target_with_context

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

CONTEXT = 16384  # the copy's max_position_embeddings (the tiny targets have 2,048)
#: Peaks above the process once its model is built, for the long sample (about 8.5K tokens), measured on the dev box
#: (bench/long_context_bench.py): training 0.30 GB (0.49 GB with the CPU attention's fixed blocks of 512 queries, which
#: hold [heads, 512, N] scores; one [N, N] product per head was 8 GB), extraction about 0.015 GB (an [N, N] fp32
#: attention mask alone would be 0.29 GB).
TRAIN_BUDGET_MB = 420
EXTRACT_BUDGET_MB = 100


def test_a_long_agentic_sample_goes_through_every_stage_whole_in_bounded_memory(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    model = target_with_context(tiny_models["Qwen3ForCausalLM"], tmp_path / "tiny-qwen3-16k", CONTEXT)
    run = run_long_sample(model, tmp_path, turns=6)
    print(f"\nFIGURES long sample {run.tokens} tokens: training peak +{run.train_mb:.0f} MB, extraction peak "
          f"+{run.extract_mb:.0f} MB")  # fmt: skip
    assert 6000 < run.tokens < CONTEXT  # whole: data.max_length is capped at the target's context only
    assert run.trained == run.tokens  # one step trained the long sample, whole
    assert run.train_mb < TRAIN_BUDGET_MB and run.extract_mb < EXTRACT_BUDGET_MB
    assert run.max_position_embeddings == CONTEXT >= run.tokens


def test_a_sample_longer_than_the_targets_context_is_a_bad_row_naming_it(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """The tiny Qwen3 has 2,048 positions: a data.max_length above that is capped there (data.truncate: cut there)."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(long_conversation(2)) + "\n")
    data = {"dataset": str(rows), "max_length": 32768, "chat_template": str(QWEN3_TOOLS)}
    model = tiny_models["Qwen3ForCausalLM"]
    for name, extra in (("refused", {}), ("cut", {"truncate": True})):
        cfg = PipelineConfig.model_validate({"run_dir": str(tmp_path / name), "data": {**data, **extra}})
        store = RunStore(cfg.run_dir)
        m = prepare(cfg, store, model)
        if name == "refused":
            assert m.num_samples == 0 and m.bad_rows[0].reason.startswith("too long: ")
            assert m.bad_rows[0].reason.endswith(
                "> the target's context (2048: max_position_embeddings) (or set data.truncate)"
            )
        else:
            assert m.num_samples == 1 and len(store.prepared_samples(0)[0]) == 2048
