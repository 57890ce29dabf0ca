"""In-process generation (synthesize, the prompts stage) on the demo model: the static KV cache that a GPU uses by
default, decoded by our own loop (eagle3.data.decode_loop; eager here: the CUDA graph it replays on a GPU needs
one), gives the same tokens as transformers' generate with the dynamic cache, greedy and per-row sampled, on the
first 32 demo prompts, and so does generate's own static cache with prompts left-padded to a multiple of
STATIC_PAD_MULTIPLE tokens (what models the loop does not fit get); the progress callback, called every few decode
steps instead of every step, still adds up to every generated token.

Compared in float32: in bfloat16 the dynamic cache itself answers a prompt differently in a batch of 64 than alone
(row 0: "L'Étoile, la Marseillaise," vs "The capital of France is Paris."; 14 of 64 rows differ between the two
caches), so bf16 equality would test rounding, not the cache (docs/performance.md, "In-process generation").
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3.config import ServerConfig, SynthesizeConfig
from eagle3.data import decode_loop, generate
from eagle3.data.chat import ChatTokenizer
from eagle3.data.generate import PROGRESS_EVERY_STEPS, STATIC_PAD_MULTIPLE, generate_batch, load_model

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
    target: tuple[object, ChatTokenizer], monkeypatch: pytest.MonkeyPatch
) -> None:
    model, chat = target
    assert decode_loop.fits(model)  # so static_cache=True below is our loop
    prompts = first_prompts(chat, 32)
    scfg = SynthesizeConfig(max_new_tokens=24, temperature=0.0, batch_size=32)
    greedy = generate_batch(model, chat, prompts, scfg, static_cache=False)
    static = generate_batch(model, chat, prompts, scfg, static_cache=True)
    assert [t.text for t in static] == [t.text for t in greedy]
    assert sum(t.tokens for t in greedy) > len(prompts) * 8  # answers, not empty turns
    assert [t.tokens for t in static] == [t.tokens for t in greedy]  # stopped at the same token

    sampling = [(0.8 if i % 2 else 0.0, 1000 + i) for i in range(16)]  # half sampled, each row its own seed
    dynamic = generate_batch(model, chat, prompts[:16], scfg, sampling=sampling, static_cache=False)
    static = generate_batch(model, chat, prompts[:16], scfg, sampling=sampling, static_cache=True)
    assert [t.text for t in static] == [t.text for t in dynamic]

    # a model the loop does not fit: generate's static cache, its prompts padded further than the dynamic batch's
    longest = max(len(chat.tokenizer(p, add_special_tokens=False).input_ids) for p in prompts)
    assert longest % STATIC_PAD_MULTIPLE
    monkeypatch.setattr(decode_loop, "fits", lambda model: False)
    static = generate_batch(model, chat, prompts, scfg, static_cache=True)
    assert [t.text for t in static] == [t.text for t in greedy]


def test_rows_that_finished_leave_the_batch_and_the_others_keep_their_tokens_greedy_and_sampled(
    target: tuple[object, ChatTokenizer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The decode loop drops finished rows from its batch (cache, mask, per-row sampler) once few are left; here at
    every step where any row has finished (COMPACT_BELOW 1, a report every step), so that rows leave one by one:
    every row's tokens are still generate's, greedy and per-row sampled."""
    model, chat = target
    prompts = first_prompts(chat, 16)
    scfg = SynthesizeConfig(max_new_tokens=48, temperature=0.0, batch_size=16)
    sampling = [(0.8 if i % 2 else 0.0, 2000 + i) for i in range(16)]
    want = [generate_batch(model, chat, prompts, scfg, sampling=rows, static_cache=False) for rows in (None, sampling)]
    compactions: list[int] = []
    compact = decode_loop._compact
    monkeypatch.setattr(
        decode_loop, "_compact", lambda cache, keep: (compactions.append(len(keep)), compact(cache, keep))
    )
    monkeypatch.setattr(decode_loop, "COMPACT_BELOW", 1.0)
    monkeypatch.setattr(generate, "PROGRESS_EVERY_STEPS", 1)
    for rows, w in zip((None, sampling), want, strict=True):
        compactions.clear()
        reported: list[int] = []
        g = generate_batch(model, chat, prompts, scfg, reported.append, sampling=rows, static_cache=True)
        assert len(compactions) >= 4 and compactions == sorted(compactions, reverse=True)  # left at several steps
        assert [(t.text, t.tokens) for t in g] == [(t.text, t.tokens) for t in w]
        assert sum(reported) == sum(t.tokens for t in g)  # progress counts every generated token, none twice
    assert len({t.tokens for t in want[0]}) > 4  # answers of many lengths: rows did finish at different steps


def test_progress_is_reported_every_few_steps_and_adds_up_to_the_generated_tokens(
    target: tuple[object, ChatTokenizer], monkeypatch: pytest.MonkeyPatch
) -> None:
    model, chat = target
    monkeypatch.setattr(generate, "PROGRESS_EVERY_S", 1e9)  # the step cadence alone (a slow CPU adds reports)
    calls: list[int] = []
    scfg = SynthesizeConfig(max_new_tokens=2 * PROGRESS_EVERY_STEPS + 3, temperature=0.0, batch_size=4)
    turns = generate_batch(model, chat, first_prompts(chat, 4), scfg, calls.append)
    assert sum(calls) == sum(t.tokens for t in turns)
    assert 1 <= len(calls) <= 3  # every PROGRESS_EVERY_STEPS decode steps, and once at the end


@pytest.mark.parametrize(
    "arch", ["LlamaForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "DeepseekV3ForCausalLM"]
)
def test_the_decode_loop_gives_the_tokens_of_generate_on_every_architecture_it_decodes(
    tiny_models: dict[str, Path], arch: str
) -> None:
    """The families users serve (a DeepSeek-V3 backbone with MLA, Qwen3 dense and MoE, Llama), tiny random-weight
    ones in float32, greedy: our loop's tokens are generate's with the dynamic cache. (gpt-oss has sliding-window
    layers: the loop does not fit it and generate keeps it, asserted here too.) Greedy only: a random-weight model's
    next-token distribution over 150K tokens is nearly flat, so a sampled draw lands within float32 rounding of a
    bucket's edge often enough that the two caches' summation orders pick different tokens; sampled rows are
    compared on the demo model's trained weights above."""
    model = load_model(tiny_models[arch], ServerConfig(device="cpu", dtype="float32"))
    chat = ChatTokenizer.from_model_dir(tiny_models[arch])
    assert decode_loop.fits(model)
    assert not decode_loop.fits(
        load_model(tiny_models["GptOssForCausalLM"], ServerConfig(device="cpu", dtype="float32"))
    )
    texts = ["Hi, who are you?", "Write a poem about the sea, the sky and a cat on a boat.", "2+2?"]
    prompts = [chat.render([{"role": "user", "content": t}], add_generation_prompt=True) for t in texts]
    scfg = SynthesizeConfig(max_new_tokens=12, temperature=0.0, batch_size=4)
    want = generate_batch(model, chat, prompts, scfg, static_cache=False)
    got = generate_batch(model, chat, prompts, scfg, static_cache=True)
    assert [(t.text, t.tokens) for t in got] == [(t.text, t.tokens) for t in want]
