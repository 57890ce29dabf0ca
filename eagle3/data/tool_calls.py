"""Tool calls in chat rows, read into the one form chat templates take (transformers' `apply_chat_template`).

    tools        row-level `tools` (or the legacy `functions`), a list or its JSON text
                 -> [{"type": "function", "function": {"name", "description", "parameters", ...}}]
    a call       an assistant's `tool_calls` entry (`{"id", "type", "function": {"name", "arguments"}}`), the legacy
                 `function_call`, or a ShareGPT/glaive `function_call` turn's JSON value
                 -> {"type": "function", "function": {"name": str, "arguments": {...}}[, "id": str]}
    a result     a `tool`/`function`/`ipython`/`observation` message -> {"role": "tool", "content": str
                 [, "tool_call_id", "name"]}

Arguments are kept as a JSON object (parsed when the row has them as text), so the same call gives the same sample
id either way; a template that concatenates them as text gets them back as compact JSON (ChatTokenizer probes which
its template takes). The prepared `messages` column holds `{"messages": [...], "tools": [...]}` for a row with tools,
the plain list otherwise (conversation_json, read_conversation).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

Tool = dict[str, Any]

#: Roles that hold a tool's result, as chat logs name them (OpenAI `tool`, its legacy `function`, Llama 3 `ipython`,
#: ShareGPT/glaive `observation`).
RESULT_ROLES = {"tool", "function", "ipython", "observation"}
#: The ShareGPT/glaive role of an assistant turn that is a call: its value is the call's JSON.
CALL_ROLES = {"function_call"}


class ToolRowError(ValueError):
    """A tool call, result or definition that cannot be read; the message is the bad-row reason."""


def _json(value: Any, what: str) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as e:
        raise ToolRowError(f"{what} is not valid JSON ({e.msg} at {e.pos})") from None


def normalize_tools(row: Mapping[str, Any]) -> list[Tool] | None:
    """The row's tool definitions in OpenAI form, or None when it has none."""
    raw = row.get("tools") if row.get("tools") is not None else row.get("functions")
    raw = _json(raw, "the row's `tools`")
    if raw is None or raw == []:
        return None
    if not isinstance(raw, list):
        raise ToolRowError(f"the row's `tools` is a {type(raw).__name__}, expected a list of function definitions")
    tools = []
    for i, tool in enumerate(raw):
        tool = _json(tool, f"tools[{i}]")
        fn = tool.get("function") if isinstance(tool, Mapping) else None
        fn = fn if isinstance(fn, Mapping) else tool  # a bare {"name", "description", "parameters"}
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ToolRowError(f"tools[{i}] has no function name (expected {{'type': 'function', 'function': "
                               "{'name': ..., 'parameters': ...}})")  # fmt: skip
        tools.append({"type": "function", "function": dict(fn)})
    return tools


def normalize_call(call: Any, i: int, j: int) -> dict[str, Any]:
    """Call j of message i -> {"type": "function", "function": {"name", "arguments": object}[, "id"]}."""
    call = _json(call, f"message {i}'s tool call {j}")
    if not isinstance(call, Mapping):
        raise ToolRowError(f"message {i}'s tool call {j} is a {type(call).__name__}, expected an object")
    fn: Mapping[str, Any] = call["function"] if isinstance(call.get("function"), Mapping) else call
    name = fn.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ToolRowError(f"message {i}'s tool call {j} has no function name")
    args = fn.get("arguments", fn.get("parameters"))
    args = {} if args is None or args == "" else _json(args, f"message {i}'s tool call {j} ({name}) arguments")
    if not isinstance(args, Mapping):
        raise ToolRowError(
            f"message {i}'s tool call {j} ({name}) arguments are a {type(args).__name__}, expected a JSON object"
        )
    out: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": dict(args)}}
    if isinstance(call.get("id"), str) and call["id"]:
        out["id"] = call["id"]
    return out


def message_calls(msg: Mapping[str, Any], raw_role: str, i: int) -> list[dict[str, Any]]:
    """The calls an assistant message makes: `tool_calls`, the legacy `function_call`, or (a ShareGPT/glaive
    `function_call` turn) its value: one call's JSON or a list of them."""
    if raw_role in CALL_ROLES:
        value = _json(msg.get("value", msg.get("content")), f"message {i} ({raw_role})")
        calls = value if isinstance(value, list) else [value]
    elif msg.get("tool_calls"):
        calls = msg["tool_calls"]
        if not isinstance(calls, Sequence) or isinstance(calls, str):
            raise ToolRowError(f"message {i}'s `tool_calls` is a {type(calls).__name__}, expected a list")
    elif msg.get("function_call"):
        calls = [msg["function_call"]]
    else:
        return []
    return [normalize_call(c, i, j) for j, c in enumerate(calls)]


def result_content(content: Any) -> Any:
    """A tool result's content: an object or list (some logs keep the JSON the tool returned) as its JSON text."""
    if isinstance(content, Mapping) or (isinstance(content, list) and not all(isinstance(p, Mapping) and "type" in p
                                                                              for p in content)):  # fmt: skip
        return json.dumps(content, ensure_ascii=False)
    return content


def has_tools(messages: Sequence[Mapping[str, Any]], tools: list[Tool] | None) -> bool:
    """Whether the conversation has tool definitions, calls or results."""
    return bool(tools) or any(m.get("tool_calls") or m["role"] == "tool" for m in messages)


def conversation_json(messages: list[dict[str, Any]], tools: list[Tool] | None) -> str:
    """The prepared `messages` column: the message list, or {"messages", "tools"} when the row has tools."""
    return json.dumps(messages if not tools else {"messages": messages, "tools": tools}, ensure_ascii=False)


def read_conversation(text: str) -> tuple[list[dict[str, Any]], list[Tool] | None]:
    """The prepared `messages` column back: (messages, tools or None)."""
    value = json.loads(text)
    if isinstance(value, Mapping):
        return list(value["messages"]), value.get("tools") or None
    return list(value), None
