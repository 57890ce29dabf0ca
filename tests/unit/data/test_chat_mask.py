"""The assistant-only loss mask on SmolLM2's ChatML template, checked by decoding the masked tokens."""

from __future__ import annotations

from typing import Any

import pytest

from eagle3.data.chat import ChatTokenizer, RowError, normalize_row, sample_id


@pytest.fixture(scope="module")
def chat(demo_tokenizer: Any) -> ChatTokenizer:
    return ChatTokenizer(demo_tokenizer)


def masked_text(chat: ChatTokenizer, ids: list[int], mask: list[int]) -> str:
    return chat.tokenizer.decode([i for i, m in zip(ids, mask, strict=True) if m])


def unmasked_text(chat: ChatTokenizer, ids: list[int], mask: list[int]) -> str:
    return chat.tokenizer.decode([i for i, m in zip(ids, mask, strict=True) if not m])


def test_end_of_turn_of_chatml_is_im_end(chat: ChatTokenizer) -> None:
    assert chat.end_of_turn == "<|im_end|>"


def test_single_turn_openai_masks_exactly_the_answer_and_im_end(chat: ChatTokenizer) -> None:
    msgs = normalize_row(
        {
            "messages": [
                {"role": "user", "content": "What is the capital of France?"},
                {"role": "assistant", "content": "The capital of France is Paris."},
            ]
        }
    )
    tok = chat.tokenize(msgs, max_length=2048, truncate=False)
    assert masked_text(chat, tok.input_ids, tok.loss_mask) == "The capital of France is Paris.<|im_end|>"
    rest = unmasked_text(chat, tok.input_ids, tok.loss_mask)
    # the default system prompt the template injects, the role headers and the user turn stay out of the loss
    assert "You are a helpful AI assistant named SmolLM" in rest
    assert "<|im_start|>user\nWhat is the capital of France?<|im_end|>" in rest
    assert "<|im_start|>assistant\n" in rest
    assert tok.input_ids == chat.tokenizer.apply_chat_template(msgs, tokenize=True)["input_ids"]


def test_multi_turn_sharegpt_masks_every_assistant_turn_and_nothing_else(chat: ChatTokenizer) -> None:
    msgs = normalize_row(
        {
            "conversations": [
                {"from": "system", "value": "You answer briefly."},
                {"from": "human", "value": "Name a fruit."},
                {"from": "gpt", "value": "An apple."},
                {"from": "human", "value": "Another one?"},
                {"from": "chatgpt", "value": "A banana."},
            ]
        }
    )
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant"]
    tok = chat.tokenize(msgs, max_length=2048, truncate=False)
    assert masked_text(chat, tok.input_ids, tok.loss_mask) == "An apple.<|im_end|>A banana.<|im_end|>"
    rest = unmasked_text(chat, tok.input_ids, tok.loss_mask)
    assert "SmolLM" not in rest  # an explicit system prompt replaces the injected one
    assert "You answer briefly." in rest and "Another one?" in rest


def test_assistant_content_that_looks_like_a_role_header_is_located_structurally(chat: ChatTokenizer) -> None:
    msgs = normalize_row(
        {
            "messages": [
                {"role": "user", "content": "Which role are you?"},
                {"role": "assistant", "content": "assistant"},
                {"role": "user", "content": "user"},
                {"role": "assistant", "content": "system"},
            ]
        }
    )
    tok = chat.tokenize(msgs, max_length=2048, truncate=False)
    assert masked_text(chat, tok.input_ids, tok.loss_mask) == "assistant<|im_end|>system<|im_end|>"


def test_assistant_first_conversation_still_masks_only_the_assistant(chat: ChatTokenizer) -> None:
    msgs = normalize_row({"messages": [{"role": "assistant", "content": "Hello, ask me anything."}]})
    tok = chat.tokenize(msgs, max_length=2048, truncate=False)
    assert masked_text(chat, tok.input_ids, tok.loss_mask) == "Hello, ask me anything.<|im_end|>"


def test_too_long_is_a_row_error_unless_truncating(chat: ChatTokenizer) -> None:
    msgs = [{"role": "user", "content": "Count."}, {"role": "assistant", "content": " ".join(["one"] * 200)}]
    with pytest.raises(RowError, match=r"too long: \d+ tokens > data.max_length=64"):
        chat.tokenize(msgs, max_length=64, truncate=False)
    tok = chat.tokenize(msgs, max_length=64, truncate=True)
    assert len(tok.input_ids) == len(tok.loss_mask) == 64 and tok.truncated and tok.num_loss_tokens > 0


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ({"text": "hi"}, "unknown schema"),
        ({"messages": []}, "empty conversation"),
        ({"messages": [{"role": "user", "content": "hi"}]}, "no assistant turn"),
        ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": " "}]}, "empty content"),
        ({"messages": [{"role": "user", "content": 3}, {"role": "assistant", "content": "x"}]}, "not a string"),
        ({"messages": [{"role": "user", "content": "\ud800"}, {"role": "assistant", "content": "x"}]}, "decodable"),
        ({"messages": [{"role": "critic", "content": "x"}, {"role": "assistant", "content": "x"}]}, "unknown role"),
        (
            {
                "messages": [
                    {"role": "user", "content": "x"},
                    {"role": "assistant", "content": None, "tool_calls": [{}]},
                ]
            },
            r"message 1's tool call 0 has no function name",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]},
                    {"role": "assistant", "content": "x"},
                ]
            },
            r"'image_url' content part in message 0 \(user\): the draft trains on text only",
        ),
        (
            {"messages": [{"role": "user", "content": ["x"]}, {"role": "assistant", "content": "x"}]},
            "'str' content part",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text"}]}, {"role": "assistant", "content": "x"}]},
            "part",
        ),
        ({"messages": [{"role": "user", "content": []}, {"role": "assistant", "content": "x"}]}, "empty content"),
    ],
)
def test_unusable_rows_raise_a_row_error_with_the_reason(row: dict[str, Any], reason: str) -> None:
    with pytest.raises(RowError, match=reason):
        normalize_row(row)


def test_openai_text_parts_and_the_developer_role_read_as_the_plain_conversation() -> None:
    """Chat logs of OpenAI-compatible servers keep content as a list of text parts and the system prompt as
    `developer`: the same conversation, so the same messages and the same sample id as the plain form."""
    parts = normalize_row(
        {
            "messages": [
                {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "Name a "}, {"type": "input_text", "text": "star."}],
                },
                {"role": "assistant", "content": [{"type": "output_text", "text": "Vega."}]},
            ]
        }
    )
    plain = normalize_row(
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Name a star."},
                {"role": "assistant", "content": "Vega."},
            ]
        }
    )
    assert parts == plain and sample_id(parts) == sample_id(plain)


def test_forced_format_requires_its_field() -> None:
    row = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}
    with pytest.raises(RowError, match=r"data\.format=sharegpt needs a `conversations` field"):
        normalize_row(row, "sharegpt")


def test_sample_ids_depend_only_on_the_normalized_conversation() -> None:
    openai = normalize_row({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})
    sharegpt = normalize_row({"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}]})
    assert sample_id(openai) == sample_id(sharegpt)
    assert len(sample_id(openai)) == 16 and int(sample_id(openai), 16) >= 0
    assert sample_id(openai) != sample_id([*openai[:1], {"role": "assistant", "content": "c"}])
