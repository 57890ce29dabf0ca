"""In-process generation (synthesize, the prompts stage) on the demo model: the static KV cache that a GPU uses by
default, with its prompts left-padded to a multiple of STATIC_PAD_MULTIPLE tokens (so that batches share compiled
shapes), gives the same tokens as the dynamic cache, greedy and per-row sampled, on the first 64 demo prompts; the
progress callback, called every few decode steps instead of every step, still adds up to every generated token.

Compared in float32: in bfloat16 the dynamic cache itself answers a prompt differently in a batch of 64 than alone
(row 0: "L'Étoile, la Marseillaise," vs "The capital of France is Paris."; 14 of 64 rows differ between the two
caches), so bf16 equality would test rounding, not the cache (docs/performance.md, "In-process generation").
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3.config import ServerConfig, SynthesizeConfig
from eagle3.data import synthesize
from eagle3.data.chat import ChatTokenizer
from eagle3.data.synthesize import PROGRESS_EVERY_STEPS, STATIC_PAD_MULTIPLE, generate_batch, load_model

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]


@pytest.fixture(scope="module")
def target(demo_model: Path) -> tuple[object, ChatTokenizer]:
    model = load_model(demo_model, ServerConfig(device="cpu", dtype="float32"))
    return model, ChatTokenizer.from_model_dir(demo_model)


def first_prompts(chat: ChatTokenizer, n: int) -> list[str]:
    rows = [json.loads(line) for line in (REPO / "data" / "demo_prompts.jsonl").read_text().splitlines()[:n]]
    firsts = [[m for m in r["messages"] if m["role"] == "user"][:1] for r in rows]
    return [chat.render(turn, add_generation_prompt=True) for turn in firsts]


def test_the_static_cache_generates_the_tokens_of_the_dynamic_cache_greedy_and_sampled(
    target: tuple[object, ChatTokenizer],
) -> None:
    model, chat = target
    prompts = first_prompts(chat, 64)
    longest = max(len(chat.tokenizer(p, add_special_tokens=False).input_ids) for p in prompts)
    assert longest % STATIC_PAD_MULTIPLE  # so the static cache's batch is padded further than the dynamic one's
    scfg = SynthesizeConfig(max_new_tokens=24, temperature=0.0, batch_size=64)
    dynamic = generate_batch(model, chat, prompts, scfg, static_cache=False)
    static = generate_batch(model, chat, prompts, scfg, static_cache=True)
    assert [t.text for t in static] == [t.text for t in dynamic]
    assert sum(t.tokens for t in dynamic) > 64 * 8  # answers, not empty turns

    sampling = [(0.8 if i % 2 else 0.0, 1000 + i) for i in range(16)]  # half sampled, each row its own seed
    dynamic = generate_batch(model, chat, prompts[:16], scfg, sampling=sampling, static_cache=False)
    static = generate_batch(model, chat, prompts[:16], scfg, sampling=sampling, static_cache=True)
    assert [t.text for t in static] == [t.text for t in dynamic]


def test_progress_is_reported_every_few_steps_and_adds_up_to_the_generated_tokens(
    target: tuple[object, ChatTokenizer], monkeypatch: pytest.MonkeyPatch
) -> None:
    model, chat = target
    monkeypatch.setattr(synthesize, "PROGRESS_EVERY_S", 1e9)  # the step cadence alone (a slow CPU adds reports)
    calls: list[int] = []
    scfg = SynthesizeConfig(max_new_tokens=2 * PROGRESS_EVERY_STEPS + 3, temperature=0.0, batch_size=4)
    turns = generate_batch(model, chat, first_prompts(chat, 4), scfg, calls.append)
    assert sum(calls) == sum(t.tokens for t in turns)
    assert 1 <= len(calls) <= 3  # every PROGRESS_EVERY_STEPS decode steps, and once at the end
