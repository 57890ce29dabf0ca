"""Conversations -> chat-template text -> token ids with the assistant-only loss mask.

The loss mask is built without knowing the template's syntax. We render the conversation twice: once
for real, once with every assistant content replaced by a unique sentinel. The sentinel render splits
into the template's literal chunks (role headers, system prompts it injects, separators); the real
render must be exactly those chunks with each assistant content (as the template printed it) between
them. That gives each assistant content's character span; the end-of-turn token is the first special
token that opens the chunk after it (ChatML `<|im_end|>`, Llama-3 `<|eot_id|>`, Gemma
`<end_of_turn>`). Token i is in the loss when its character span (fast-tokenizer offsets) overlaps
one of those spans. Anything the template does that breaks this reconstruction is a bad row, never a
silently wrong mask.

Tool calls (eagle3/data/tool_calls.py) extend the same method: each call's function name is a sentinel too, and in a
conversation with tool calls every system, user and tool content is one, so the chunks are the template's own text
alone. A turn's span then runs from the end of its header (the chunk before its content when the turn is rendered
as its content alone) through the end-of-turn token after its last call: its reasoning, text and calls in the
template's call syntax. Tool results are context.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from eagle3.config import DataConfig
from eagle3.data.tool_calls import (
    CALL_ROLES,
    RESULT_ROLES,
    Tool,
    ToolRowError,
    has_tools,
    message_calls,
    normalize_tools,
    result_content,
)

#: {"role": "system" | "user" | "assistant" | "tool", "content": str[, "reasoning_content": str][, "tool_calls":
#: [...]][, "tool_call_id": str, "name": str]} (tool calls and results: eagle3/data/tool_calls.py)
Message = dict[str, Any]
RowFormat = Literal["auto", "sharegpt", "openai"]

ROLES = {
    "system": "system",
    "developer": "system",  # OpenAI's newer name for the system message
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
}
ROLE_NAMES = set(ROLES) | RESULT_ROLES | CALL_ROLES
TEXT_PARTS = {"text", "input_text", "output_text"}  # content-part types that are text (chat and responses APIs)
_KEYS = {"sharegpt": "conversations", "openai": "messages"}
_SENTINEL = "\ue000eagle3-assistant-{}\ue001"  # private-use code points: no template or text contains them
_REASONING = "\ue000eagle3-reasoning-{}\ue001"
_CALL = "\ue000eagle3-call-{}\ue001"  # a tool call's function name (message k, call j: "k.j")
_CONTEXT = "\ue000eagle3-context-{}\ue001"  # a system, user or tool content (conversations with tool calls)
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"  # how thinking models print their reasoning


class RowError(ValueError):
    """A conversation that cannot become a training sample; the message is the bad-row reason."""


class ChatTemplateError(RuntimeError):
    """The model's tokenizer cannot be used for prepare (slow tokenizer, no chat template)."""


# normalization ----------------------------------------------------------------------------------
def _field(msg: Mapping[str, Any], *names: str) -> Any:
    for name in names:
        value = msg.get(name)
        if value is not None:
            return value
    return None


def _text_content(content: Any, i: int, role: str) -> Any:
    """OpenAI content parts (`[{"type": "text", "text": ...}, ...]`, as chat logs store them) -> their text, joined
    as the API joins them; anything else is returned as it is, for the checks that follow."""
    if not isinstance(content, Sequence) or isinstance(content, str):
        return content
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
        if kind not in TEXT_PARTS or not isinstance(part.get("text"), str):
            raise RowError(
                f"a {kind!r} content part in message {i} ({role}): the draft trains on text only; "
                "drop the row, or its non-text parts"
            )
        texts.append(part["text"])
    return "".join(texts)


def normalize_row(row: Mapping[str, Any], fmt: RowFormat = "auto") -> list[Message]:
    """A ShareGPT (`conversations`: from/value) or OpenAI (`messages`: role/content, content a string or text
    parts) row -> messages.

    Raises RowError with the reason when the row cannot be used."""
    if fmt == "auto":
        present = [k for k in ("conversations", "messages") if row.get(k) is not None]
        if not present:
            raise RowError(f"unknown schema: no `conversations` or `messages` field (keys: {sorted(row)})")
        key = present[0]
    else:
        key = _KEYS[fmt]
        if row.get(key) is None:
            raise RowError(f"unknown schema: data.format={fmt} needs a `{key}` field (keys: {sorted(row)})")
    turns = row[key]
    if not isinstance(turns, Sequence) or isinstance(turns, str):
        raise RowError(f"unknown schema: `{key}` is a {type(turns).__name__}, expected a list of messages")
    if len(turns) == 0:
        raise RowError("empty conversation")
    messages: list[Message] = []
    for i, msg in enumerate(turns):
        if not isinstance(msg, Mapping):
            raise RowError(f"unknown schema: message {i} is a {type(msg).__name__}, expected an object")
        raw_role = _field(msg, "role", "from")
        name = str(raw_role).lower()
        role = "tool" if name in RESULT_ROLES else "assistant" if name in CALL_ROLES else ROLES.get(name)
        if raw_role is None or role is None:
            raise RowError(f"unknown role {raw_role!r} in message {i} (expected one of {sorted(ROLE_NAMES)})")
        try:
            calls = message_calls(msg, name, i) if role == "assistant" else []
            content = None if name in CALL_ROLES else _field(msg, "content", "value")
            content = _text_content(result_content(content) if role == "tool" else content, i, role)
        except ToolRowError as e:
            raise RowError(str(e)) from None
        if content is None and (calls or role == "tool"):
            content = ""  # a turn that only calls, a tool that returned nothing
        if not isinstance(content, str):
            raise RowError(f"content not a string in message {i} ({role}): got {type(content).__name__}")
        try:
            content.encode("utf-8")
        except UnicodeEncodeError as e:
            raise RowError(f"content not decodable in message {i} ({role}): {e.reason} at {e.start}") from None
        if not content.strip() and not calls and role != "tool":
            raise RowError(f"empty content in message {i} ({role})")
        message: Message = {"role": role, "content": content}
        if calls:
            message["tool_calls"] = calls
        if role == "tool":
            for key in ("tool_call_id", "name"):
                if isinstance(msg.get(key), str) and msg[key]:
                    message[key] = msg[key]
        reasoning = msg.get("reasoning_content")
        if reasoning is not None and role == "assistant":  # OpenAI-style separated reasoning (thinking models)
            if not isinstance(reasoning, str):
                raise RowError(f"reasoning_content not a string in message {i}: got {type(reasoning).__name__}")
            if reasoning.strip():
                message["reasoning_content"] = reasoning
        messages.append(message)
    if not any(m["role"] == "assistant" for m in messages):
        raise RowError("no assistant turn")
    return messages


def split_reasoning(text: str) -> tuple[str | None, str]:
    """A generated turn `[<think>]reasoning</think>answer` -> (reasoning, answer); no closing tag: (None, text).
    The opening tag may be in the generation prompt (templates that start the thinking for the model)."""
    head, sep, tail = text.partition(THINK_CLOSE)
    if not sep:
        return None, text.strip()
    reasoning = head.strip().removeprefix(THINK_OPEN).strip()
    return (reasoning or None), tail.strip()


def row_tools(row: Mapping[str, Any]) -> list[Tool] | None:
    """The row's tool definitions (`tools`, or the legacy `functions`) in OpenAI form; None when it has none."""
    try:
        return normalize_tools(row)
    except ToolRowError as e:
        raise RowError(str(e)) from None


def canonical_json(messages: list[Message], tools: list[Tool] | None = None) -> str:
    value: Any = messages if not tools else {"messages": messages, "tools": tools}
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def sample_id(messages: list[Message], tools: list[Tool] | None = None) -> str:
    """First 16 hex digits of sha256 over the canonical JSON of the normalized conversation (with its tools, when
    it has them: a conversation without tools keeps the id it always had)."""
    return hashlib.sha256(canonical_json(messages, tools).encode("utf-8")).hexdigest()[:16]


# template + mask --------------------------------------------------------------------------------
def _text_arguments(call: dict[str, Any]) -> dict[str, Any]:
    """A call with its arguments as JSON text, for templates that concatenate them (DeepSeek-V3)."""
    arguments = json.dumps(call["function"]["arguments"], ensure_ascii=False)
    return {**call, "function": {**call["function"], "arguments": arguments}}


#: What a bad row with tool calls says to do when the template cannot render them.
TOOL_FIX = (
    ": the target's chat template must render tool calls; set data.chat_template to the model's tool-calling "
    "template (a Jinja file), or leave the rows with tool calls out of data.dataset"
)
Field = tuple[str, int, int]  # ("content" | "reasoning" | "call" | "context", message index, call index)


@dataclass(frozen=True)
class Tokenized:
    input_ids: list[int]
    loss_mask: list[int]  # 1 on assistant content and the end-of-turn token that closes it
    truncated: bool = False

    @property
    def num_loss_tokens(self) -> int:
        return sum(self.loss_mask)


class ChatTokenizer:
    """A fast Hugging Face tokenizer with a chat template, plus the loss-mask logic."""

    def __init__(
        self,
        tokenizer: Any,
        name: str = "tokenizer",
        *,
        chat_template: str | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
        context_length: int | None = None,
    ):
        self.context_length = context_length  # the target's max_position_embeddings: no sample is longer
        if chat_template is not None:  # data.chat_template: replaces the tokenizer's own
            tokenizer.chat_template = chat_template
        self.template_kwargs = dict(template_kwargs or {})  # data.chat_template_kwargs, e.g. enable_thinking
        if not getattr(tokenizer, "is_fast", False):
            raise ChatTemplateError(f"{name}: a fast tokenizer (tokenizer.json) is needed for the loss mask")
        if not getattr(tokenizer, "chat_template", None):
            raise ChatTemplateError(f"{name}: the tokenizer has no chat template; use an instruct/chat model")
        self.tokenizer = tokenizer
        self.name = name
        self.special = sorted(
            {t.content for t in tokenizer.added_tokens_decoder.values() if t.special}
            | set(tokenizer.all_special_tokens),
            key=len,
            reverse=True,
        )
        self.call_arguments: str | None = None
        self.end_of_turn = self._probe_end_of_turn()
        #: How the template takes a tool call's arguments: "object" (printed with tojson: Qwen3, Llama 3.x),
        #: "string" (concatenated as text: DeepSeek-V3); None: it does not print tool calls (no tool support).
        self.call_arguments = self._probe_tool_calls()

    @classmethod
    def from_model_dir(cls, model_dir: Path, data: DataConfig | None = None) -> ChatTokenizer:
        """The model's tokenizer, with `data.chat_template` (a Jinja file) and `data.chat_template_kwargs`, and the
        model's context length (config.json's max_position_embeddings, when it has one)."""
        from transformers import AutoTokenizer

        from eagle3.target.files import read_target_config
        from eagle3.target.layout import text_config

        template = None
        if data is not None and data.chat_template is not None:
            path = Path(data.chat_template)
            if not path.is_file():
                raise ChatTemplateError(f"data.chat_template: {path} does not exist (a Jinja chat template file)")
            template = path.read_text(encoding="utf-8")
        kwargs = data.chat_template_kwargs if data is not None else None
        context = text_config(read_target_config(model_dir)).get("max_position_embeddings")
        return cls(AutoTokenizer.from_pretrained(model_dir), str(model_dir), chat_template=template,
                   template_kwargs=kwargs, context_length=int(context) if context else None)  # fmt: skip

    def render(
        self, messages: list[Message], add_generation_prompt: bool = False, tools: list[Tool] | None = None
    ) -> str:
        return self._apply(messages, add_generation_prompt, tools, self.call_arguments)

    def _apply(
        self, messages: list[Message], add_generation_prompt: bool, tools: list[Tool] | None, arguments: str | None
    ) -> str:
        if arguments == "string":  # the template concatenates them: compact JSON text
            messages = [{**m, "tool_calls": [_text_arguments(c) for c in m["tool_calls"]]} if m.get("tool_calls")
                        else m for m in messages]  # fmt: skip
        kwargs = {**self.template_kwargs, **({"tools": tools} if tools else {})}
        try:
            text = self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs
            )
        except Exception as e:  # jinja raises TemplateError/TypeError for conversations it refuses
            fix = TOOL_FIX if has_tools(messages, tools) else ""
            raise RowError(f"chat template refused the conversation: {type(e).__name__}: {e}{fix}") from None
        assert isinstance(text, str)
        return text

    def _leading_special(self, chunk: str) -> str | None:
        """The first special token of chunk when only whitespace precedes it, else None."""
        body = chunk.lstrip()
        for tok in self.special:
            if body.startswith(tok):
                return chunk[: len(chunk) - len(body) + len(tok)]
        return None

    def _probe_end_of_turn(self) -> str | None:
        probe = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": _SENTINEL.format(0)}]
        try:
            text = self.render(probe)
        except RowError:
            return None
        _, sep, tail = text.partition(_SENTINEL.format(0))
        eot = self._leading_special(tail) if sep else None
        return eot.strip() if eot else None

    def _probe_tool_calls(self) -> str | None:
        name = _CALL.format("probe")
        call = {"type": "function", "function": {"name": name, "arguments": {"x": 1}}}
        probe: list[Message] = [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": "1"},
        ]
        for arguments in ("object", "string"):
            try:
                if name in self._apply(probe, False, None, arguments):
                    return arguments
            except RowError:
                continue
        return None

    def _marked(
        self, messages: list[Message], tools: list[Tool] | None, *, full: bool, context: bool
    ) -> tuple[list[Field], list[str]]:
        """Render with sentinels in place of the text each message contributes. Returns the fields in the order the
        template printed them and the literal chunks around them (one more than fields). `full`: each assistant
        content, reasoning and tool call's function name is a field; else each assistant message is its content
        alone (no reasoning, no calls): the chunk before it ends where the turn's header does. `context`: system,
        user and tool contents are fields too, so a chunk is the template's own text (conversations with tool calls).
        A reasoning or context the template leaves out (e.g. Qwen3 drops the thinking of turns before the last user
        turn) is not a field; an assistant content or call it leaves out is a RowError."""
        marked: list[Message] = []
        wanted: list[tuple[Field, str]] = []
        for k, m in enumerate(messages):
            if m["role"] != "assistant":
                if context and m["content"]:
                    wanted.append((("context", k, 0), _CONTEXT.format(k)))
                    m = {**m, "content": _CONTEXT.format(k)}
                marked.append(m)
                continue
            if not full:
                wanted.append((("content", k, 0), _SENTINEL.format(k)))
                marked.append({"role": "assistant", "content": _SENTINEL.format(k)})
                continue
            calls = m.get("tool_calls") or []
            mm = {**m}
            if m["content"] or not calls:  # a turn that only calls keeps its empty content: templates test it
                wanted.append((("content", k, 0), _SENTINEL.format(k)))
                mm["content"] = _SENTINEL.format(k)
            if "reasoning_content" in m:
                wanted.append((("reasoning", k, 0), _REASONING.format(k)))
                mm["reasoning_content"] = _REASONING.format(k)
            if calls:
                names = [_CALL.format(f"{k}.{j}") for j in range(len(calls))]
                wanted += [(("call", k, j), name) for j, name in enumerate(names)]
                mm["tool_calls"] = [{**c, "function": {**c["function"], "name": name}}
                                    for c, name in zip(calls, names, strict=True)]  # fmt: skip
            marked.append(mm)
        rest = self.render(marked, tools=tools)
        found: list[tuple[int, Field, str]] = []
        for (kind, k, j), sentinel in wanted:
            pos = rest.find(sentinel)
            if pos >= 0:
                found.append((pos, (kind, k, j), sentinel))
            elif kind == "content" and not messages[k].get("tool_calls"):
                raise RowError(f"chat template did not print assistant message {k}; cannot build the loss mask")
            elif kind == "call":
                name = messages[k]["tool_calls"][j]["function"]["name"]
                raise RowError(f"chat template did not print message {k}'s tool call {j} ({name}){TOOL_FIX}")
        chunks: list[str] = []
        for _, _, sentinel in sorted(found):
            head, _, rest = rest.partition(sentinel)
            chunks.append(head)
        chunks.append(rest)
        return [f for _, f, _ in sorted(found)], chunks

    def _check_row(self, messages: list[Message], tools: list[Tool] | None) -> None:
        """Refuse what the mask cannot be built for: no tool support, the sentinel character, arguments that hold
        the end-of-turn token (the turn's end is found as the first one after its last call)."""
        texts = [m["content"] for m in messages] + [m.get("reasoning_content", "") for m in messages]
        calls = [(k, j, c["function"]) for k, m in enumerate(messages) for j, c in enumerate(m.get("tool_calls", []))]
        args = {(k, j): json.dumps(f["arguments"], ensure_ascii=False) for k, j, f in calls}
        if any("\ue000" in t for t in [*texts, *(f["name"] for _, _, f in calls), *args.values()]):
            raise RowError("content contains private-use character U+E000 used as the loss-mask sentinel")
        if not has_tools(messages, tools):
            return
        if self.call_arguments is None:
            at = next((k for k, m in enumerate(messages) if m.get("tool_calls") or m["role"] == "tool"), None)
            kind = "a tool result" if at is not None and messages[at]["role"] == "tool" else "a tool call"
            what = "the row's `tools`" if at is None else f"message {at} ({kind})"
            raise RowError(f"{what}: the chat template has no tool support (it does not print tool calls){TOOL_FIX}")
        for (k, j), text in args.items():
            if self.end_of_turn and self.end_of_turn in text:
                raise RowError(f"message {k}'s tool call {j} arguments contain the end-of-turn token "
                               f"{self.end_of_turn}; no loss mask")  # fmt: skip

    def assistant_spans(
        self, messages: list[Message], tools: list[Tool] | None = None
    ) -> tuple[str, list[tuple[int, int]]]:
        """The rendered text and the [start, end) character spans that go into the loss: per assistant turn, what
        the model writes after the turn's header: its reasoning as the template prints it (the opening tag
        included), its content, its tool calls (the template's call syntax included), through the end-of-turn
        token. Tool results, system and user turns are context."""
        self._check_row(messages, tools)
        tooled = has_tools(messages, tools)
        text = self.render(messages, tools=tools)
        if tools and text == self.render(messages):
            names = ", ".join(t["function"]["name"] for t in tools)
            raise RowError(f"the chat template does not print the row's `tools` ({names}){TOOL_FIX}")
        fields, chunks = self._marked(messages, tools, full=True, context=tooled)
        first: dict[int, int] = {}  # turn -> its first and last printed field
        last: dict[int, int] = {}
        for n, (kind, k, _) in enumerate(fields):
            if kind != "context":
                first.setdefault(k, n)
                last[k] = n
        openers = self._openers(messages, tools, fields, chunks, first, tooled)
        spans: list[tuple[int, int]] = []
        pos = 0
        for n, (kind, k, j) in enumerate(fields):
            if not text.startswith(chunks[n], pos):
                raise RowError(f"chat template renders message {k} differently with other content; no loss mask")
            pos += len(chunks[n])
            end = self._field_end(text, pos, (kind, k, j), messages[k], chunks[n + 1])
            if kind != "context" and first[k] == n:
                start = pos - openers.get(k, 0)
            if kind != "context" and last[k] == n:
                spans.append((start, end + self._closing(k, messages[k], chunks[n + 1])))
            pos = end
        if text[pos:] != chunks[-1]:
            raise RowError("chat template output does not match its chunks; cannot build the loss mask")
        return text, spans

    def _openers(
        self,
        messages: list[Message],
        tools: list[Tool] | None,
        fields: list[Field],
        chunks: list[str],
        first: dict[int, int],
        tooled: bool,
    ) -> dict[int, int]:
        """Per turn whose first printed field is not its content (a reasoning, a call), the length of what the
        template prints between the turn's header and that field (`<think>\\n`, `<tool_call>\\n{"name": "`): the
        chunk before the field, less the chunk before the turn's content when it is printed alone."""
        need = {k: n for k, n in first.items() if fields[n][0] != "content"}
        if not need:
            return {}
        plain_fields, plain_chunks = self._marked(messages, tools, full=False, context=tooled)
        before = {k: plain_chunks[i] for i, (kind, k, _) in enumerate(plain_fields) if kind == "content"}
        openers = {}
        for k, n in need.items():
            if k in before and chunks[n].startswith(before[k]):
                openers[k] = len(chunks[n]) - len(before[k])
            elif messages[k].get("tool_calls"):
                raise RowError(f"cannot find where assistant message {k} starts in the rendered template text (its "
                               "header differs with and without its tool calls); no loss mask")  # fmt: skip
        return openers

    def _field_end(self, text: str, pos: int, field: Field, message: Message, after: str) -> int:
        """Where the field at `pos` ends in `text`: its value as the template printed it (as is, or stripped), with
        the next chunk right after it. A context may be printed the template's own way (e.g. as JSON): it ends where
        the next chunk starts."""
        kind, k, j = field
        if kind == "reasoning":
            value: str = message["reasoning_content"]
        elif kind == "call":
            value = message["tool_calls"][j]["function"]["name"]
        else:
            value = message["content"]
        for shown in (value, value.strip(), value.lstrip(), value.rstrip()):
            if text.startswith(shown, pos) and text.startswith(after, pos + len(shown)):
                return pos + len(shown)
        if kind == "context" and after and (at := text.find(after, pos)) >= 0:
            return at
        what = f"message {k}'s content" if kind == "context" else f"assistant message {k}'s {kind}"
        raise RowError(f"cannot locate {what} in the rendered template text; no loss mask")

    def _closing(self, k: int, message: Message, after: str) -> int:
        """Length of the turn's closing text after its last printed field that is in the loss: the end-of-turn token
        that opens the next chunk; for a turn with tool calls, the call syntax's close through the end-of-turn token
        (in a conversation with tool calls every context is a field, so `after` is the template's own text)."""
        if not message.get("tool_calls"):
            eot = self._leading_special(after)
            return len(eot) if eot else 0
        at = after.find(self.end_of_turn) if self.end_of_turn else -1
        if at < 0:
            raise RowError(f"no end-of-turn token ({self.end_of_turn}) after assistant message {k}'s tool calls in "
                           "the rendered template text; no loss mask")  # fmt: skip
        return at + len(self.end_of_turn or "")

    def tokenize(
        self, messages: list[Message], max_length: int, truncate: bool, tools: list[Tool] | None = None
    ) -> Tokenized:
        text, spans = self.assistant_spans(messages, tools)
        enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids: list[int] = list(enc["input_ids"])
        mask = [0] * len(ids)
        j = 0
        for i, (s, e) in enumerate(enc["offset_mapping"]):
            while j < len(spans) and spans[j][1] <= s:
                j += 1
            if j < len(spans) and s < spans[j][1] and e > spans[j][0]:
                mask[i] = 1
        limit, what = max_length, f"data.max_length={max_length}"
        if self.context_length is not None and self.context_length < max_length:
            limit, what = self.context_length, f"the target's context ({self.context_length}: max_position_embeddings)"
        if len(ids) > limit:
            if not truncate:
                raise RowError(f"too long: {len(ids)} tokens > {what} (or set data.truncate)")
            ids, mask = ids[:limit], mask[:limit]
            if not any(mask):
                raise RowError(f"no assistant tokens within the first {limit} tokens ({what})")
            return Tokenized(ids, mask, truncated=True)
        return Tokenized(ids, mask)
