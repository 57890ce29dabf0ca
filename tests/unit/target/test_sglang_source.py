"""The families table against the SGLang it pins, read as source (nothing is imported or run): every model file of
sglang/srt/models/ that captures layers for a draft has a row (or says why it serves no target), every row's files
capture, and each row's EAGLE-3 id rule is the one its files' set_eagle3_layers_to_capture applies. A new SGLang
release that adds a family or changes a rule fails here, naming the file to read and the row to add or change."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

from eagle3.serving.launch_args import TWO_BATCH_OVERLAP_SKIPS
from eagle3.target.families import FAMILIES, FIRST_ID_IS_1, GPT_OSS, NOT_TARGETS, PLUS_ONE, Family

REPO = Path(__file__).resolve().parents[3]
SETTERS = ("set_eagle3_layers_to_capture", "set_dflash_layers_to_capture")

pytestmark = pytest.mark.sglang


@cache
def models_dir() -> Path:
    found = sorted((REPO / ".venv-sglang").glob("lib/python3*/site-packages/sglang/srt/models"))
    if not found:
        pytest.skip("no SGLang environment (.venv-sglang): make sglang-env")
    return found[0]


@cache
def setters(file: str) -> dict[str, list[str]]:
    """{setter name: the source of each definition of it} in one model file."""
    path = models_dir() / file
    text = path.read_text()
    out: dict[str, list[str]] = {}
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef) and node.name in SETTERS:
            out.setdefault(node.name, []).append(ast.get_source_segment(text, node) or "")
    return out


def capturing_files() -> list[str]:
    return sorted(p.name for p in models_dir().glob("*.py") if any(f"def {s}(" in p.read_text() for s in SETTERS))


def eagle3_rules_in(file: str) -> set[str]:
    """The EAGLE-3 rules the file's own setters apply (empty where a setter only hands the ids on)."""
    rules = set()
    for body in setters(file).get("set_eagle3_layers_to_capture", []):
        if re.search(r"layer_ids\[0\]\s*==\s*1", body):
            rules.add(FIRST_ID_IS_1)
        elif re.search(r"max\(layer_ids\)\s*==\s*num_layers", body):
            rules.add(GPT_OSS)
        elif re.search(r"val \+ 1 for val in layer_ids", body):
            rules.add(PLUS_ONE)
    return rules


def test_every_sglang_file_that_captures_layers_has_a_row_or_a_reason() -> None:
    covered = {f for family in FAMILIES for f in family.sglang_files} | set(NOT_TARGETS)
    missing = [f for f in capturing_files() if f not in covered]
    assert missing == [], (
        f"sglang/srt/models/{missing}: these files capture layers for a draft (set_eagle3_layers_to_capture or "
        "set_dflash_layers_to_capture) but eagle3/target/families.py has no row for them: read their setters and "
        "the decoder loop's capture, and add a row (rule, DFlash rule, tap) or a NOT_TARGETS entry"
    )
    assert len(capturing_files()) >= 40  # the 43 files of 0.5.23: a broken glob would pass the line above vacuously


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.architecture)
def test_each_row_names_files_that_capture_and_a_class_sglang_serves(family: Family) -> None:
    for file in family.sglang_files:
        assert (models_dir() / file).is_file(), f"{family.architecture}: sglang/srt/models/{file} does not exist"
        assert setters(file), f"{family.architecture}: sglang/srt/models/{file} has no capture setter"
    classes = "\n".join(p.read_text() for p in models_dir().glob("*.py"))
    assert re.search(rf"\b{re.escape(family.architecture)}\b", classes), f"SGLang serves no {family.architecture}"
    if family.sglang_rule is None:  # block drafters only: none of its files captures for EAGLE-3
        assert not any("set_eagle3_layers_to_capture" in setters(f) for f in family.sglang_files), family
    else:
        assert any("set_eagle3_layers_to_capture" in setters(f) for f in family.sglang_files), family
    if family.dflash_rule is not None:
        assert any("set_dflash_layers_to_capture" in setters(f) for f in family.sglang_files), family


@pytest.mark.parametrize("family", [f for f in FAMILIES if f.sglang_rule], ids=lambda f: f.architecture)
def test_each_rows_eagle3_rule_is_what_its_files_setter_applies(family: Family) -> None:
    applied = set().union(*(eagle3_rules_in(f) for f in family.sglang_files))
    assert family.sglang_rule in applied, (
        f"{family.architecture}: families.py says {family.sglang_rule}, sglang/srt/models/"
        f"{family.sglang_files} apply {sorted(applied) or 'no rule of their own'}"
    )


def test_the_rule_reader_tells_the_three_rules_apart() -> None:
    assert eagle3_rules_in("llama.py") == {PLUS_ONE}
    assert eagle3_rules_in("deepseek_v2.py") == {FIRST_ID_IS_1}
    assert eagle3_rules_in("gpt_oss.py") == {GPT_OSS}
    assert eagle3_rules_in("kimi_k25.py") == set()  # it hands the ids to DeepSeek's language model


def test_the_files_whose_capture_two_batch_overlap_skips_are_the_ones_the_refusal_names() -> None:
    """A capturing file whose layer loop is cut short (after the dense layers) or skipped (every layer through
    model_forward_stages) under `forward_batch.can_run_tbo`, with no guard for the EAGLE-3 capture (mimo_v2.py has
    one: `and not self.layers_to_capture`; glm5_next.py's guards DFlash only)."""
    cut = re.compile(
        r"if forward_batch\.can_run_tbo(?P<guard>[^:]*):\s*\n\s*"
        r"(if \(?\s*self\.first_k_dense_replace|hidden_states = model_forward_stages)"
    )
    skipping = []
    for file in capturing_files():
        for m in cut.finditer((models_dir() / file).read_text()):
            if "layers_to_capture" not in m["guard"]:
                skipping.append(file)
    assert tuple(sorted(set(skipping))) == TWO_BATCH_OVERLAP_SKIPS, "update eagle3/serving/launch_args.py"
