"""synthesize.regenerate on multi-turn and tool-call conversations, with the tiny Qwen3 target and a Qwen3-style
template with tools (transformers engine, CPU): which turns the target writes again, from which history, with the
row's tools in every prompt; the sample id and an exact resume after a kill hold for each choice."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import eagle3.data.synthesize as synth
from eagle3.config import PipelineConfig
from eagle3.data.chat import Message, normalize_row, row_tools, sample_id
from eagle3.data.prepare import prepare
from eagle3.store.run_store import RunStore

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

QWEN3 = Path(__file__).resolve().parents[1] / "assets" / "qwen3_tools_template.jinja"
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
CHAT = {
    "messages": [
        {"role": "user", "content": "Name a colour of the sky."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "And at sunset?"},
        {"role": "assistant", "content": "Orange."},
    ]
}
TOOLS = {
    "tools": [WEATHER],
    "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"temp": 20}'},
        {"role": "assistant", "content": "It is 20 C."},
    ],
}  # fmt: skip


def config(tmp_path: Path, name: str, data: Path, regenerate: str) -> PipelineConfig:
    return PipelineConfig.model_validate(
        {
            "run_dir": str(tmp_path / name),
            "data": {"dataset": str(data), "chat_template": str(QWEN3)},
            "synthesize": {"max_new_tokens": 6, "temperature": 0.9, "seed": 3, "batch_size": 4,
                           "regenerate": regenerate},
            "server": {"device": "cpu", "dtype": "bfloat16"},
        }
    )  # fmt: skip


def records(store: RunStore) -> list[dict[str, Any]]:
    return [json.loads(line) for line in synth.synthesized_shard_path(store, 0).open()]


def answers(messages: list[Message]) -> list[str]:
    return [m["content"] for m in messages if m["role"] == "assistant"]


@pytest.mark.parametrize("regenerate", ["all", "recorded", "last", "none"])
def test_each_choice_regenerates_its_turns_from_its_history_and_resumes_exactly(
    regenerate: str, tmp_path: Path, tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tiny_models["Qwen3ForCausalLM"]
    data = tmp_path / "traffic.jsonl"
    data.write_text(json.dumps(CHAT) + "\n" + json.dumps(TOOLS) + "\n")
    prompts: list[tuple[int, list[Message]]] = []  # (position, the conversation it was generated from)
    real_prompt = synth.turn_prompt

    def spy(conv: list[Message], position: int, recorded: list[Message] | None = None) -> list[Message]:
        prompts.append((position, real_prompt(conv, position, recorded)))
        return prompts[-1][1]

    monkeypatch.setattr(synth, "turn_prompt", spy)
    clean = config(tmp_path, "clean", data, regenerate)
    store = RunStore(clean.run_dir)
    source = prepare(clean, store, model)
    result = synth.synthesize(clean, store, model)
    assert not result.summary.failed and result.manifest.num_samples == 2
    chat, tools = records(store)
    assert "tools" not in chat and tools["tools"] == [WEATHER]  # the row's tools travel with its sample

    src_chat, src_tools = normalize_row(CHAT), normalize_row(TOOLS)
    if regenerate == "none":  # the served turns are kept: the samples are the source's, ids and all
        assert prompts == [] and chat["messages"] == src_chat and tools["messages"] == src_tools
        served = store.synthesis_source().prepared_samples(0)
        assert [s.sample_id for s in store.prepared_samples(0)] == [s.sample_id for s in served]
    elif regenerate == "last":  # only the last answer, from the recorded history
        assert [p for p, _ in prompts] == [3, 3]
        assert answers(chat["messages"])[0] == "Blue." and answers(chat["messages"])[1] != "Orange."
        assert tools["messages"][:3] == src_tools[:3] and tools["messages"][3]["content"] != "It is 20 C."
        assert all(history == src[:3] for (_, history), src in zip(prompts, (src_chat, src_tools), strict=True))
    else:  # every answer; `all` from the turns regenerated before it, except with tool calls
        assert sorted(p for p, _ in prompts) == [1, 1, 3, 3]
        assert "Blue." not in answers(chat["messages"]) and "Orange." not in answers(chat["messages"])
        (chat_last,) = [h for p, h in prompts if p == 3 and h[0]["content"].startswith("Name")]
        assert chat_last[1]["content"] == ("Blue." if regenerate == "recorded" else chat["messages"][1]["content"])
        (tool_last,) = [h for p, h in prompts if p == 3 and h[0]["content"].startswith("Weather")]
        assert tool_last == src_tools[:3]  # the recorded call before its recorded result, in either mode
        assert tools["messages"][2] == src_tools[2]  # the tool result as recorded
    # the prepared sample is the record's conversation, with its tools, under its content id
    rows = store.read_prepared_shard(0).to_pydict()
    assert rows["sample_id"] == [sample_id(chat["messages"]), sample_id(tools["messages"], row_tools(tools))]

    # a kill after the first sample was stored: the next run generates the other, and the result is the same
    killed = config(tmp_path, "killed", data, regenerate)
    store2 = RunStore(killed.run_dir)
    assert prepare(killed, store2, model).dataset_fingerprint == source.dataset_fingerprint
    real_write = synth.atomic_write_json

    def dies_after_one(path: Path, obj: Any) -> None:
        if path.parent.name == "samples" and any(path.parent.glob("*.json")):
            raise KeyboardInterrupt("killed")
        real_write(path, obj)

    monkeypatch.setattr(synth, "atomic_write_json", dies_after_one)
    with pytest.raises(KeyboardInterrupt):
        synth.synthesize(killed, store2, model)
    monkeypatch.setattr(synth, "atomic_write_json", real_write)
    again = synth.synthesize(killed, store2, model)
    assert again.summary.generated == 1
    assert [r["messages"] for r in records(store2)] == [chat["messages"], tools["messages"]]
    assert store2.read_prepared_shard(0).to_pydict()["sample_id"] == rows["sample_id"]
