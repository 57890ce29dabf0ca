"""The varied corpus through a real SGLang server on CPU (server.engine: sglang): the prompts stage writes its
requests through the server, synthesize answers each twice (greedy and sampled, the seed sent per request) and
writes one more user turn through it too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import eagle3.data.prompts as pg
import eagle3.data.synthesize as synth
from eagle3.config import EvaluateConfig, PromptsConfig
from eagle3.data.prepare import prepare
from eagle3.serving.server import SGLangServer
from eagle3.store.run_store import RunStore
from tests.integration.sglang_support import synthesize_config as config
from tests.integration.sglang_support import synthesized_records as records

pytestmark = [pytest.mark.sglang, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


def test_prompts_and_multi_sample_multi_turn_synthesize_through_sglang(
    tmp_path: Path,
    demo_model: Path,
    plain_server: SGLangServer,
) -> None:
    server = plain_server  # the session's (tests/integration/conftest.py)
    corpus = tmp_path / "run" / "prompts" / "prompts.jsonl"
    cfg = config(tmp_path / "run", demo_model, corpus, max_new_tokens=8, temperature=0.8, samples_per_prompt=2,
                 include_greedy=True, user_turns=1)  # fmt: skip
    cfg.prompts = PromptsConfig(self_instruct=3, max_new_tokens=16, grid=str(REPO / "data" / "prompt_grid.yaml"))
    cfg.evaluate = EvaluateConfig.model_validate(
        {"sets": [{"name": "varied", "dataset": str(REPO / "data" / "eval_varied_prompts.jsonl")}]}
    )
    summary = pg.build_prompts(cfg, demo_model, servers=[server])
    assert summary.cells == 3 and summary.generated == 3 and not summary.failed
    assert len(list((pg.out_dir(cfg) / "samples").glob("*.json"))) == 3
    assert pg.build_prompts(cfg, demo_model, servers=[server]).generated == 0  # resumed: nothing to write

    store = RunStore(cfg.run_dir)
    source = prepare(cfg, store, demo_model)
    result = synth.synthesize(cfg, store, demo_model, servers=[server])
    assert result.summary.samples == 2 * source.num_samples and not result.summary.failed
    assert result.summary.prompt_tokens > 0 and result.summary.cached_prompt_tokens == 0  # server.prefix_cache off
    recs = records(store)
    assert len(recs) == 2 * source.num_samples
    assert all(r["sample"] in (r["source_sample_id"], f"{r['source_sample_id']}.s1") for r in recs)
    multi = [r for r in recs if r["user_turns"] == 1]
    assert multi and all([m["role"] for m in r["messages"]] == ["user", "assistant"] * 2 for r in multi)
    assert json.loads(pg.corpus_path(cfg).read_text().splitlines()[0])["messages"][0]["role"] == "user"
