"""Tool calls rendered by the target's own chat template: every row schema, exact loss masks (token by token against
the rendered text) on a Qwen3-style and a Llama 3.1-style template written for these tests, and each bad-row reason."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from eagle3.data.chat import ChatTokenizer, RowError, normalize_row, row_tools, sample_id
from eagle3.data.tool_calls import conversation_json, read_conversation

ASSETS = Path(__file__).resolve().parents[2] / "assets"
QWEN3 = ASSETS / "qwen3_tools_template.jinja"
LLAMA3 = ASSETS / "llama3_tools_template.jinja"
LLAMA_TOKENS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>"]

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def fresh_tokenizer(demo_model: Path, extra: list[str] | None = None) -> Any:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(demo_model)  # not the session's: ChatTokenizer sets its template
    if extra:
        tok.add_special_tokens({"additional_special_tokens": extra})
    return tok


@pytest.fixture(scope="module")
def qwen3(demo_model: Path) -> ChatTokenizer:
    return ChatTokenizer(fresh_tokenizer(demo_model), chat_template=QWEN3.read_text())


@pytest.fixture(scope="module")
def llama3(demo_model: Path) -> ChatTokenizer:
    return ChatTokenizer(fresh_tokenizer(demo_model, LLAMA_TOKENS), chat_template=LLAMA3.read_text())


@pytest.fixture(scope="module")
def plain(demo_model: Path) -> ChatTokenizer:
    return ChatTokenizer(fresh_tokenizer(demo_model))  # SmolLM2's ChatML: no tool support


def openai_row(arguments: Any = '{"city": "Paris"}') -> dict[str, Any]:
    return {
        "tools": [WEATHER],
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": arguments}}],
            },
            {"role": "tool", "content": '{"temp": 20}'},
            {"role": "assistant", "content": "It is 20 C in Paris."},
        ],
    }


#: The same conversation in every schema prepare reads (ids of calls left out: the forms that have none).
SCHEMAS = {
    "openai, arguments as JSON text": openai_row(),
    "openai, arguments as an object": openai_row({"city": "Paris"}),
    "openai legacy function_call / function": {
        "functions": [WEATHER["function"]],
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "function_call": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            },
            {"role": "function", "content": '{"temp": 20}'},
            {"role": "assistant", "content": "It is 20 C in Paris."},
        ],
    },
    "sharegpt/glaive function_call / observation, tools as JSON text": {
        "tools": json.dumps([WEATHER["function"]]),
        "conversations": [
            {"from": "human", "value": "Weather in Paris?"},
            {"from": "function_call", "value": '{"name": "get_weather", "arguments": {"city": "Paris"}}'},
            {"from": "observation", "value": '{"temp": 20}'},
            {"from": "gpt", "value": "It is 20 C in Paris."},
        ],
    },
    "sharegpt tool_calls / tool": {
        "tools": [WEATHER],
        "conversations": [
            {"from": "human", "value": "Weather in Paris?"},
            {"from": "gpt", "value": "", "tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]},
            {"from": "tool", "value": '{"temp": 20}'},
            {"from": "gpt", "value": "It is 20 C in Paris."},
        ],
    },
    "llama 3 ipython": {
        "tools": [WEATHER],
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
            },
            {"role": "ipython", "content": {"temp": 20}},
            {"role": "assistant", "content": "It is 20 C in Paris."},
        ],
    },
}


def expected_mask(chat: ChatTokenizer, text: str, trained: list[str]) -> list[int]:
    """Token i is 1 when its characters overlap one of the `trained` strings, found in `text` in order (by hand)."""
    spans, at = [], 0
    for piece in trained:
        start = text.index(piece, at)
        spans.append((start, start + len(piece)))
        at = start + len(piece)
    offsets = chat.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    return [int(any(s < e2 and e > s2 for s2, e2 in spans)) for s, e in offsets]


def check_exact(chat: ChatTokenizer, row: dict[str, Any], trained: list[str]) -> str:
    messages, tools = normalize_row(row), row_tools(row)
    tok = chat.tokenize(messages, max_length=4096, truncate=False, tools=tools)
    text = chat.render(messages, tools=tools)
    assert tok.input_ids == chat.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tok.loss_mask == expected_mask(chat, text, trained)
    return text


@pytest.mark.parametrize("schema", list(SCHEMAS))
def test_every_schema_reads_as_the_same_openai_conversation_and_sample_id(schema: str) -> None:
    row = SCHEMAS[schema]
    messages, tools = normalize_row(row), row_tools(row)
    assert messages == [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
        },
        {"role": "tool", "content": '{"temp": 20}'},
        {"role": "assistant", "content": "It is 20 C in Paris."},
    ]
    assert tools == [WEATHER]
    assert sample_id(messages, tools) == sample_id(normalize_row(openai_row()), [WEATHER])
    assert read_conversation(conversation_json(messages, tools)) == (messages, tools)


def test_a_conversation_without_tools_keeps_its_sample_id_and_list_form() -> None:
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    before = hashlib.sha256(json.dumps(messages, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]
    assert sample_id(messages, None) == sample_id(messages) == before  # the id prepare always gave it
    assert conversation_json(messages, None) == json.dumps(messages)
    assert sample_id(messages, [WEATHER]) != sample_id(messages)  # the tools are part of what the model saw


def test_tool_call_ids_names_and_results_are_kept_as_the_row_has_them() -> None:
    row = openai_row()
    row["messages"][1]["tool_calls"][0]["id"] = "call_1"
    row["messages"][2] |= {"tool_call_id": "call_1", "name": "get_weather"}
    messages = normalize_row(row)
    assert messages[1]["tool_calls"][0]["id"] == "call_1"
    assert messages[2] == {"role": "tool", "content": '{"temp": 20}', "tool_call_id": "call_1", "name": "get_weather"}


def test_qwen3_style_masks_reasoning_calls_and_answers_exactly_and_never_tool_results(qwen3: ChatTokenizer) -> None:
    row = {
        "tools": [WEATHER],
        "messages": [
            {"role": "system", "content": "You help."},
            {"role": "user", "content": "Weather in Paris, then Lyon and Nice?"},
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "I need the tool.",
                "tool_calls": [{"function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}],
            },
            {"role": "tool", "content": '{"temp": 20}'},
            {
                "role": "assistant",
                "content": "Paris: 20 C.",
                "tool_calls": [
                    {"function": {"name": "get_weather", "arguments": {"city": "Lyon"}}},
                    {"function": {"name": "get_weather", "arguments": {"city": "Nice"}}},
                ],
            },
            {"role": "tool", "content": "21"},
            {"role": "tool", "content": "22"},
            {"role": "assistant", "content": "Lyon 21 C, Nice 22 C."},
        ],
    }
    text = check_exact(
        qwen3,
        row,
        [
            "<think>\nI need the tool.\n</think>\n\n"
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>',
            'Paris: 20 C.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Nice"}}\n</tool_call><|im_end|>',
            "Lyon 21 C, Nice 22 C.<|im_end|>",
        ],
    )
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in text  # the tools, as context
    assert "<|im_start|>user\n<tool_response>\n21\n</tool_response>\n<tool_response>\n22\n</tool_response>" in text


def test_llama3_style_masks_the_json_call_and_answer_and_not_the_ipython_turn(llama3: ChatTokenizer) -> None:
    assert llama3.end_of_turn == "<|eot_id|>" and llama3.call_arguments == "object"
    row = SCHEMAS["llama 3 ipython"]
    text = check_exact(
        llama3,
        row,
        ['{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>', "It is 20 C in Paris.<|eot_id|>"],
    )
    assert '<|start_header_id|>ipython<|end_header_id|>\n\n"{\\"temp\\": 20}"<|eot_id|>' in text  # printed as JSON
    assert '"name": "get_weather"' in text.split("Weather in Paris?")[0]  # the tools, in the first user turn


def test_a_template_that_concatenates_arguments_gets_them_as_compact_json(demo_model: Path) -> None:
    """DeepSeek-V3-style templates add the arguments to a string: they are given as JSON text."""
    template = (
        "{%- for m in messages -%}<|im_start|>{{ m.role }}\n{{ m.content }}"
        "{%- for c in m.tool_calls or [] -%}<tool_call>{{ c.function.name + '\n' + c.function.arguments }}"
        "</tool_call>{%- endfor -%}<|im_end|>\n{%- endfor -%}"
    )
    chat = ChatTokenizer(fresh_tokenizer(demo_model), chat_template=template)
    assert chat.call_arguments == "string"
    check_exact(
        chat,
        {"messages": openai_row({"city": "Paris", "units": "C"})["messages"]},  # it prints no tools
        [
            '<tool_call>get_weather\n{"city": "Paris", "units": "C"}</tool_call><|im_end|>',
            "It is 20 C in Paris.<|im_end|>",
        ],
    )


@pytest.mark.parametrize(
    ("template", "row", "reason"),
    [
        ("plain", openai_row(), r"message 1 \(a tool call\): the chat template has no tool support .*"
         r"set data.chat_template to the model's tool-calling template"),
        ("plain", {"messages": [{"role": "tool", "content": "{}"}, {"role": "assistant", "content": "Done."}]},
         r"message 0 \(a tool result\): the chat template has no tool support"),
        ("plain", {"tools": [WEATHER], "messages": openai_row()["messages"][:1] + openai_row()["messages"][3:]},
         r"the row's `tools`: the chat template has no tool support"),
        ("calls only", {"tools": [WEATHER], **{k: v for k, v in openai_row().items() if k != "tools"}},
         r"the chat template does not print the row's `tools` \(get_weather\).*data.chat_template"),
        ("llama3", {**openai_row(), "messages": [
            {"role": "user", "content": "Two cities?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"function": {"name": "get_weather", "arguments": {"city": "Lyon"}}},
                {"function": {"name": "get_weather", "arguments": {"city": "Nice"}}}]},
            {"role": "tool", "content": "21"}, {"role": "assistant", "content": "Done."}]},
         r"chat template refused the conversation: .*only supports single tool-calls.*data.chat_template"),
        ("qwen3", openai_row("{city: Paris}"), r"message 1's tool call 0 \(get_weather\) arguments is not valid JSON"),
        ("qwen3", openai_row("[1, 2]"), r"message 1's tool call 0 \(get_weather\) arguments are a list, expected"),
        ("qwen3", openai_row('{"text": "<|im_end|>"}'),
         r"message 1's tool call 0 arguments contain the end-of-turn token <\|im_end\|>"),
        ("qwen3", {"tools": "[{", "messages": openai_row()["messages"]}, r"the row's `tools` is not valid JSON"),
        ("qwen3", {"tools": [{"description": "x"}], "messages": openai_row()["messages"]},
         r"tools\[0\] has no function name"),
        ("qwen3", {"conversations": [{"from": "human", "value": "a"}, {"from": "function_call", "value": "oops"}]},
         r"message 1 \(function_call\) is not valid JSON"),
    ],
)  # fmt: skip
def test_rows_that_cannot_be_rendered_or_masked_are_bad_rows_naming_the_message_and_the_fix(
    template: str, row: dict[str, Any], reason: str, qwen3: ChatTokenizer, llama3: ChatTokenizer,
    plain: ChatTokenizer, demo_model: Path,
) -> None:  # fmt: skip
    calls_only = (  # a template that prints calls but not the tools
        "{%- for m in messages -%}<|im_start|>{{ m.role }}\n{{ m.content }}{%- for c in m.tool_calls or [] -%}"
        "<tool_call>{{ c.function.name }}</tool_call>{%- endfor -%}<|im_end|>\n{%- endfor -%}"
    )
    chats = {"qwen3": qwen3, "llama3": llama3, "plain": plain}
    chat = chats.get(template) or ChatTokenizer(fresh_tokenizer(demo_model), chat_template=calls_only)
    with pytest.raises(RowError, match=reason):
        chat.tokenize(normalize_row(row), max_length=4096, truncate=False, tools=row_tools(row))


def test_prepare_on_the_tiny_qwen3_keeps_every_schema_and_loses_only_the_rows_it_cannot_render(
    tmp_path: Path, tiny_models: dict[str, Path]
) -> None:
    from eagle3.config import PipelineConfig
    from eagle3.data.prepare import prepare
    from eagle3.store.run_store import RunStore

    plain_row = {"messages": [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."}]}
    bad = openai_row('{"city": ')
    rows = [SCHEMAS["openai, arguments as JSON text"], SCHEMAS["llama 3 ipython"], plain_row, bad,
            {**SCHEMAS["sharegpt/glaive function_call / observation, tools as JSON text"], "tools": None}]  # fmt: skip
    data = tmp_path / "traffic.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    model = tiny_models["Qwen3ForCausalLM"]

    def run(name: str, **extra: Any) -> tuple[RunStore, Any]:
        cfg = PipelineConfig.model_validate({"run_dir": str(tmp_path / name), "data": {"dataset": str(data), **extra}})
        store = RunStore(cfg.run_dir)
        return store, prepare(cfg, store, model)

    store, m = run("qwen3", chat_template=str(QWEN3))
    assert m.duplicates == 1  # the ipython row is the OpenAI row
    assert [(b.row, b.reason) for b in m.bad_rows] == [
        (3, "message 1's tool call 0 (get_weather) arguments is not valid JSON (Expecting value at 9)")
    ]
    t = store.read_prepared_shard(0).to_pydict()
    assert t["source"] == [f"{data}:0", f"{data}:2", f"{data}:4"]
    chat = ChatTokenizer(fresh_tokenizer(model), chat_template=QWEN3.read_text())
    for k, row in ((0, rows[0]), (2, rows[4])):  # the samples as the template renders them, masks exact
        messages, tools = read_conversation(t["messages"][k])
        assert (messages, tools) == (normalize_row(row), row_tools(row))
        tok = chat.tokenize(messages, 4096, False, tools)
        assert t["input_ids"][k] == tok.input_ids and t["loss_mask"][k] == tok.loss_mask and sum(tok.loss_mask) > 0

    # the model's own template (SmolLM2's ChatML) has no tool support: the tool rows are bad rows, the rest is kept
    store, m = run("plain")
    assert m.num_samples == 1
    reasons = {b.row: b.reason for b in m.bad_rows}
    assert sorted(reasons) == [0, 1, 3, 4] and "set data.chat_template" in reasons[0]
    assert reasons[0].startswith("message 1 (a tool call): the chat template has no tool support")


def test_the_tool_call_evaluation_set_prompts_end_with_a_tool_result_and_render_with_their_tools(
    qwen3: ChatTokenizer,
) -> None:
    """data/eval_tool_calls.jsonl (written for this project): each prompt ends with a tool's result, so the draft is
    measured on the assistant's turn after it; rendered with the row's tools as a served request is."""
    from eagle3.data.eval_sets import chat_rows, prompt_conversation

    rows = chat_rows(ASSETS.parents[1] / "data" / "eval_tool_calls.jsonl")
    assert len(rows) >= 16 and all(error is None for _, _, error in rows)
    categories = set()
    for _, row, _ in rows:
        assert row is not None
        categories.add(row["category"])
        messages, tools = prompt_conversation(row)
        assert messages[-1]["role"] == "tool" and tools
        assert any(m.get("tool_calls") for m in messages)
        text = qwen3.render(messages, add_generation_prompt=True, tools=tools)
        assert text.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n")
        assert all(t["function"]["name"] in text for t in tools)
    assert len(categories) >= 8 and "parallel" in categories and "multi-step" in categories


def test_a_grow_intake_of_served_logs_with_tool_calls_appends_only_the_new_conversations(
    tmp_path: Path, tiny_models: dict[str, Path]
) -> None:
    """Nightly files of served traffic (docs/gpu-node.md): the second night's file adds its new tool-call
    conversations; one the store holds (logged with its arguments as an object this time) is known, not added again,
    and a row the template cannot render is a bad row of that intake."""
    from eagle3.config import PipelineConfig
    from eagle3.data.prepare import prepare
    from eagle3.store.run_store import RunStore

    traffic = tmp_path / "traffic"
    traffic.mkdir()
    (traffic / "2026-12-01.jsonl").write_text(json.dumps(openai_row()) + "\n")
    cfg = PipelineConfig.model_validate(
        {"run_dir": str(tmp_path / "run"), "data": {"dataset": str(traffic), "chat_template": str(QWEN3)}}
    )
    store = RunStore(cfg.run_dir)
    model = tiny_models["Qwen3ForCausalLM"]
    first = prepare(cfg, store, model)
    assert first.num_samples == 1
    lyon = openai_row({"city": "Lyon"})
    night2 = [SCHEMAS["openai, arguments as an object"], lyon, openai_row("{oops")]
    (traffic / "2026-12-02.jsonl").write_text("".join(json.dumps(r) + "\n" for r in night2))
    grown = prepare(cfg, store, model)
    intake = grown.intakes[-1]
    assert list(intake.files) == [str(traffic / "2026-12-02.jsonl")]
    assert (intake.new_samples, intake.known_samples, intake.bad_rows) == (1, 1, 1)
    assert grown.num_samples == 2 and grown.shards == [1, 1]
    (added,) = store.prepared_samples(1)
    assert added.sample_id == sample_id(normalize_row(lyon), row_tools(lyon)) and added.source.endswith("02.jsonl:1")


def test_qwen3_style_keeps_the_thinking_of_every_tool_step_after_the_query_and_drops_it_before(
    qwen3: ChatTokenizer,
) -> None:
    steps = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "Need the tool.",
         "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": '{"temp": 20}'},
        {"role": "assistant", "content": "It is 20 C.", "reasoning_content": "The tool says 20."},
    ]  # fmt: skip
    call = '\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
    check_exact(qwen3, {"messages": steps}, [
        "<think>\nNeed the tool.\n</think>\n\nChecking." + call,
        "<think>\nThe tool says 20.\n</think>\n\nIt is 20 C.<|im_end|>",
    ])  # fmt: skip
    later = [*steps, {"role": "user", "content": "Thanks!"}, {"role": "assistant", "content": "Welcome."}]
    text = check_exact(qwen3, {"messages": later}, ["Checking." + call, "It is 20 C.<|im_end|>", "Welcome.<|im_end|>"])
    assert "Need the tool." not in text  # the template drops thinking before the last user query: not in the loss


def test_the_offline_evaluator_loads_the_tool_call_set_with_each_rows_tools(qwen3: ChatTokenizer) -> None:
    """evaluate.sets with data/eval_tool_calls.jsonl: each prompt is the conversation up to the tool's result,
    rendered with the row's tools (the draft then predicts the assistant's next turn), as the target serves it."""
    from eagle3.evaluate.offline import load_eval_set

    loaded = load_eval_set("tool-calls", str(ASSETS.parents[1] / "data" / "eval_tool_calls.jsonl"), qwen3, limit=4,
                           kind="agentic (tool calls)")  # fmt: skip
    assert len(loaded.ids) == 4 and all(c is not None for c in loaded.categories)
    for ids in loaded.ids:
        text = qwen3.tokenizer.decode(ids)
        assert "<tools>" in text and text.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n")


def test_the_default_tool_call_set_is_skipped_with_its_reason_where_the_template_has_no_tools(
    plain: ChatTokenizer, qwen3: ChatTokenizer
) -> None:
    """configs/demo.yaml's tool-call set: on SmolLM2's own template (no tool support) the set is skipped with a
    reason naming the row and the fix, and the other sets still load; on a template with tools it loads."""
    from eagle3.config import load_config
    from eagle3.data.eval_sets import EvalError
    from eagle3.evaluate.offline import evaluated, load_eval_set

    sets = load_config(ASSETS.parents[1] / "configs" / "demo.yaml").evaluate.eval_sets()
    tool = next(s for s in sets if s.name == "tool-calls")
    assert sets[-1] == tool and tool.dataset == "data/eval_tool_calls.jsonl"  # last: never the first (live) set
    dataset = str(ASSETS.parents[1] / tool.dataset)
    skipped = load_eval_set(tool.name, dataset, plain, limit=tool.num_prompts, kind=tool.kind)
    assert skipped.ids == [] and skipped.skipped is not None
    assert skipped.skipped.startswith(f"{dataset} row 0 carries tools and the target's chat template has no tool")
    assert skipped.skipped.endswith("set data.chat_template to the model's tool-calling template (a Jinja file) "
                                    "to evaluate this set")  # fmt: skip
    varied = load_eval_set("varied", str(ASSETS.parents[1] / "data" / "eval_varied_prompts.jsonl"), plain, limit=2)
    assert varied.skipped is None and len(varied.ids) == 2
    assert evaluated([skipped, varied]) == [varied]
    with pytest.raises(EvalError, match=r"no evaluation set can be evaluated with this target \(tool-calls: "):
        evaluated([skipped])
    loaded = load_eval_set(tool.name, dataset, qwen3, limit=tool.num_prompts, kind=tool.kind)
    assert loaded.skipped is None and len(loaded.ids) == tool.num_prompts
