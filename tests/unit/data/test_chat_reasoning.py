"""Reasoning models: data.chat_template (a thinking-style Jinja template written for these tests, on SmolLM2's
tokenizer), data.chat_template_kwargs, and reasoning_content rendered inside the loss mask (checked by hand)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from eagle3.config import DataConfig, PipelineConfig
from eagle3.data.chat import ChatTemplateError, ChatTokenizer, normalize_row, sample_id, split_reasoning
from eagle3.data.prepare import dataset_fingerprint, prepare
from eagle3.store.run_store import RunStore

TEMPLATE = Path(__file__).resolve().parents[2] / "assets" / "thinking_template.jinja"


@pytest.fixture(scope="module")
def chat(demo_tokenizer: Any) -> ChatTokenizer:
    return ChatTokenizer(demo_tokenizer, chat_template=TEMPLATE.read_text())


def masked(chat: ChatTokenizer, messages: list[dict[str, str]]) -> tuple[str, str]:
    tok = chat.tokenize(messages, max_length=2048, truncate=False)
    on = chat.tokenizer.decode([t for t, m in zip(tok.input_ids, tok.loss_mask, strict=True) if m])
    off = chat.tokenizer.decode([t for t, m in zip(tok.input_ids, tok.loss_mask, strict=True) if not m])
    return on, off


def test_the_reasoning_its_tags_the_answer_and_im_end_are_in_the_loss_and_the_prompt_is_not(
    chat: ChatTokenizer,
) -> None:
    msgs = normalize_row(
        {
            "messages": [
                {"role": "user", "content": "What is 2+2?"},
                {"role": "assistant", "content": "4.", "reasoning_content": "Two plus two is four."},
            ]
        }
    )
    assert msgs[1] == {"role": "assistant", "content": "4.", "reasoning_content": "Two plus two is four."}
    on, off = masked(chat, msgs)
    assert on == "<think>\nTwo plus two is four.\n</think>\n\n4.<|im_end|>"
    assert off == "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n\n"


def test_a_reasoning_the_template_leaves_out_is_not_in_the_loss_and_later_turns_keep_theirs(
    chat: ChatTokenizer,
) -> None:
    msgs = normalize_row(
        {
            "messages": [
                {"role": "user", "content": "Hi."},
                {"role": "assistant", "content": "Hello.", "reasoning_content": "Greet back."},
                {"role": "user", "content": "Bye."},
                {"role": "assistant", "content": "Goodbye.", "reasoning_content": "Say goodbye."},
            ]
        }
    )
    text = chat.render(msgs)
    assert "Greet back." not in text  # the template drops the thinking of turns before the last user turn
    on, _ = masked(chat, msgs)
    assert on == "Hello.<|im_end|><think>\nSay goodbye.\n</think>\n\nGoodbye.<|im_end|>"


def test_chat_template_kwargs_reach_the_template(demo_tokenizer: Any) -> None:
    off = ChatTokenizer(demo_tokenizer, chat_template=TEMPLATE.read_text(), template_kwargs={"enable_thinking": False})
    on = ChatTokenizer(demo_tokenizer, chat_template=TEMPLATE.read_text())
    prompt = [{"role": "user", "content": "Hi."}]
    assert off.render(prompt, add_generation_prompt=True).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert on.render(prompt, add_generation_prompt=True).endswith("<|im_start|>assistant\n")


def test_a_generated_turn_is_split_into_reasoning_and_answer() -> None:
    assert split_reasoning("<think>\nWhy.\n</think>\n\nBecause.") == ("Why.", "Because.")
    assert split_reasoning("Why.</think>Because.") == ("Why.", "Because.")  # the prompt opened the block
    assert split_reasoning("<think>\n\n</think>\n\nBecause.") == (None, "Because.")
    assert split_reasoning("  Because. ") == (None, "Because.")


def test_reasoning_content_is_part_of_the_sample_id_and_only_kept_on_assistant_turns() -> None:
    row = {
        "messages": [{"role": "user", "content": "Q", "reasoning_content": "x"}, {"role": "assistant", "content": "A"}]
    }
    plain = normalize_row(row)
    assert plain[0] == {"role": "user", "content": "Q"}
    row["messages"][1]["reasoning_content"] = "R"
    assert sample_id(normalize_row(row)) != sample_id(plain)


def test_prepare_renders_with_data_chat_template_and_kwargs_and_fingerprints_the_template_text(
    tmp_path: Path, demo_model: Path
) -> None:
    data = tmp_path / "rows.jsonl"
    row = {
        "messages": [
            {"role": "user", "content": "Q?"},
            {"role": "assistant", "content": "A.", "reasoning_content": "R."},
        ]
    }
    data.write_text(json.dumps(row) + "\n")
    template = tmp_path / "t.jinja"
    template.write_text(TEMPLATE.read_text())
    cfg = PipelineConfig.model_validate(
        {
            "run_dir": str(tmp_path / "run"),
            "data": {
                "dataset": str(data),
                "chat_template": str(template),
                "chat_template_kwargs": {"enable_thinking": True},
            },
        }
    )
    store = RunStore(cfg.run_dir)
    prepare(cfg, store, demo_model)
    (sample,) = store.prepared_samples(0)
    chat = ChatTokenizer.from_model_dir(demo_model, cfg.data)
    assert chat.template_kwargs == {"enable_thinking": True}
    assert chat.tokenizer.decode([t for t, m in zip(sample.input_ids, sample.loss_mask, strict=True) if m]) == (
        "<think>\nR.\n</think>\n\nA.<|im_end|>"
    )
    before = dataset_fingerprint(cfg.data)
    template.write_text(TEMPLATE.read_text() + "\n")
    assert dataset_fingerprint(cfg.data) != before  # the template's text, not only its path


def test_a_missing_chat_template_file_is_named(demo_model: Path, tmp_path: Path) -> None:
    with pytest.raises(ChatTemplateError, match=r"data.chat_template: .*nope.jinja does not exist"):
        ChatTokenizer.from_model_dir(demo_model, DataConfig(chat_template=str(tmp_path / "nope.jinja")))
