"""The longest prompt a launched SGLang server takes, as the preflight computes it (eagle3.checks.preflight
.sglang_longest_prompt: min(context, KV pool) - 7), against the real server: the plain server of the demo model runs
with --context-length 512, so it takes a 505-token prefill (extraction's request: max_new_tokens 0) and refuses 506."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from eagle3.checks.preflight import sglang_longest_prompt
from eagle3.serving.server import SGLangServer
from tests.integration.sglang_support import CONTEXT, SYNTH_PROMPTS, synthesize_config

pytestmark = [pytest.mark.sglang, pytest.mark.slow]


def test_the_server_takes_the_longest_prompt_the_preflight_allows_and_refuses_one_more_token(
    plain_server: SGLangServer, demo_model: Path, tmp_path: Path
) -> None:
    cfg = synthesize_config(tmp_path / "run", demo_model, SYNTH_PROMPTS)
    longest = sglang_longest_prompt(cfg, demo_model)
    assert longest is not None and longest[0] == CONTEXT - 7 and "--context-length" in longest[1]

    def prefill(tokens: int) -> httpx.Response:
        body = {"input_ids": [100 + i % 1000 for i in range(tokens)], "sampling_params": {"max_new_tokens": 0}}
        return httpx.post(f"{plain_server.url}/generate", json=body, timeout=300)

    took = prefill(longest[0])
    assert took.status_code == 200, took.text[:300]
    assert took.json()["meta_info"]["prompt_tokens"] == longest[0]
    refused = prefill(longest[0] + 1)
    assert refused.status_code == 400, refused.text[:300]
