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
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from eagle3.config import DataConfig

Message = dict[str, str]  # {"role": "system" | "user" | "assistant", "content": str[, "reasoning_content": str]}
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
#: Roles of tool calls and their results, as chat logs name them (OpenAI, ShareGPT/glaive, Llama 3).
TOOL_ROLES = {"tool", "function", "function_call", "ipython", "observation"}
TEXT_PARTS = {"text", "input_text", "output_text"}  # content-part types that are text (chat and responses APIs)
_KEYS = {"sharegpt": "conversations", "openai": "messages"}
_SENTINEL = "\ue000eagle3-assistant-{}\ue001"  # private-use code points: no template or text contains them
_REASONING = "\ue000eagle3-reasoning-{}\ue001"
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
        role = ROLES.get(str(raw_role).lower()) if raw_role is not None else None
        calls = [k for k in ("tool_calls", "function_call") if msg.get(k)] if role == "assistant" else []
        if str(raw_role).lower() in TOOL_ROLES or calls:
            raise RowError(
                f"message {i} is part of a tool call ({calls[0] if calls else f'role {raw_role!r}'}): conversations "
                "with tool calls are not supported; leave them out of data.dataset or keep only their text turns"
            )
        if role is None:
            raise RowError(f"unknown role {raw_role!r} in message {i} (expected one of {sorted(ROLES)})")
        content = _text_content(_field(msg, "content", "value"), i, role)
        if not isinstance(content, str):
            raise RowError(f"content not a string in message {i} ({role}): got {type(content).__name__}")
        try:
            content.encode("utf-8")
        except UnicodeEncodeError as e:
            raise RowError(f"content not decodable in message {i} ({role}): {e.reason} at {e.start}") from None
        if not content.strip():
            raise RowError(f"empty content in message {i} ({role})")
        message: Message = {"role": role, "content": content}
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


def canonical_json(messages: list[Message]) -> str:
    return json.dumps(messages, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def sample_id(messages: list[Message]) -> str:
    """First 16 hex digits of sha256 over the canonical JSON of the normalized conversation."""
    return hashlib.sha256(canonical_json(messages).encode("utf-8")).hexdigest()[:16]


# template + mask --------------------------------------------------------------------------------
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
    ):
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
        self.end_of_turn = self._probe_end_of_turn()

    @classmethod
    def from_model_dir(cls, model_dir: Path, data: DataConfig | None = None) -> ChatTokenizer:
        """The model's tokenizer, with `data.chat_template` (a Jinja file) and `data.chat_template_kwargs`."""
        from transformers import AutoTokenizer

        template = None
        if data is not None and data.chat_template is not None:
            path = Path(data.chat_template)
            if not path.is_file():
                raise ChatTemplateError(f"data.chat_template: {path} does not exist (a Jinja chat template file)")
            template = path.read_text(encoding="utf-8")
        kwargs = data.chat_template_kwargs if data is not None else None
        return cls(
            AutoTokenizer.from_pretrained(model_dir), str(model_dir), chat_template=template, template_kwargs=kwargs
        )

    def render(self, messages: list[Message], add_generation_prompt: bool = False) -> str:
        try:
            text = self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=add_generation_prompt, **self.template_kwargs
            )
        except Exception as e:  # jinja raises TemplateError/TypeError for conversations it refuses
            raise RowError(f"chat template refused the conversation: {type(e).__name__}: {e}") from None
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

    def _marked(self, messages: list[Message], reasoning: bool) -> tuple[list[tuple[str, int]], list[str]]:
        """Render with each assistant content (and, with `reasoning`, each reasoning) replaced by a sentinel.
        Returns the fields in the order the template printed them, ("content" | "reasoning", message index),
        and the literal chunks around them (one more than fields). A reasoning the template leaves out (e.g.
        Qwen3 drops the thinking of turns before the last user turn) is not a field."""
        marked: list[Message] = []
        for k, m in enumerate(messages):
            if m["role"] != "assistant":
                marked.append(m)
                continue
            mm = {"role": "assistant", "content": _SENTINEL.format(k)}
            if reasoning and "reasoning_content" in m:
                mm["reasoning_content"] = _REASONING.format(k)
            marked.append(mm)
        rest = self.render(marked)
        found: list[tuple[int, str, int]] = []
        for k, mm in enumerate(marked):
            for kind, sentinel in (("content", _SENTINEL), ("reasoning", _REASONING)):
                if mm["role"] != "assistant" or (kind == "reasoning" and "reasoning_content" not in mm):
                    continue
                pos = rest.find(sentinel.format(k))
                if pos < 0 and kind == "content":
                    raise RowError(f"chat template did not print assistant message {k}; cannot build the loss mask")
                if pos >= 0:
                    found.append((pos, kind, k))
        fields = [(kind, k) for _, kind, k in sorted(found)]
        chunks: list[str] = []
        for kind, k in fields:
            head, _, rest = rest.partition((_SENTINEL if kind == "content" else _REASONING).format(k))
            chunks.append(head)
        chunks.append(rest)
        return fields, chunks

    def assistant_spans(self, messages: list[Message]) -> tuple[str, list[tuple[int, int]]]:
        """The rendered text and the [start, end) character spans that go into the loss: per assistant turn,
        its reasoning as the template prints it (the opening tag included), through its content and the
        end-of-turn token."""
        if any("\ue000" in m["content"] or "\ue000" in m.get("reasoning_content", "") for m in messages):
            raise RowError("content contains private-use character U+E000 used as the loss-mask sentinel")
        text = self.render(messages)
        fields, chunks = self._marked(messages, reasoning=True)
        openers: dict[int, int] = {}  # turn -> length of the tag the template prints before its reasoning
        if any(kind == "reasoning" for kind, _ in fields):
            plain_fields, plain_chunks = self._marked(messages, reasoning=False)
            before = {k: plain_chunks[i] for i, (_, k) in enumerate(plain_fields)}  # chunk before each content
            for n, (kind, k) in enumerate(fields):
                if kind == "reasoning" and chunks[n].startswith(before[k]):
                    openers[k] = len(chunks[n]) - len(before[k])
        spans: list[tuple[int, int]] = []
        starts: dict[int, int] = {}
        pos = 0
        for n, (kind, k) in enumerate(fields):
            if not text.startswith(chunks[n], pos):
                raise RowError(f"chat template renders message {k} differently with other content; no loss mask")
            pos += len(chunks[n])
            value = messages[k]["content"] if kind == "content" else messages[k]["reasoning_content"]
            for shown in (value, value.strip(), value.lstrip(), value.rstrip()):
                if text.startswith(shown, pos) and text.startswith(chunks[n + 1], pos + len(shown)):
                    break
            else:
                raise RowError(
                    f"cannot locate assistant message {k}'s {kind} in the rendered template text; no loss mask"
                )
            end = pos + len(shown)
            if kind == "reasoning":
                starts[k] = pos - openers.get(k, 0)
            else:
                eot = self._leading_special(chunks[n + 1])
                spans.append((starts.pop(k, pos), end + (len(eot) if eot else 0)))
            pos = end
        if text[pos:] != chunks[-1]:
            raise RowError("chat template output does not match its chunks; cannot build the loss mask")
        return text, spans

    def tokenize(self, messages: list[Message], max_length: int, truncate: bool) -> Tokenized:
        text, spans = self.assistant_spans(messages)
        enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids: list[int] = list(enc["input_ids"])
        mask = [0] * len(ids)
        j = 0
        for i, (s, e) in enumerate(enc["offset_mapping"]):
            while j < len(spans) and spans[j][1] <= s:
                j += 1
            if j < len(spans) and s < spans[j][1] and e > spans[j][0]:
                mask[i] = 1
        if len(ids) > max_length:
            if not truncate:
                raise RowError(f"too long: {len(ids)} tokens > data.max_length={max_length} (or set data.truncate)")
            ids, mask = ids[:max_length], mask[:max_length]
            if not any(mask):
                raise RowError(f"no assistant tokens within the first data.max_length={max_length} tokens")
            return Tokenized(ids, mask, truncated=True)
        return Tokenized(ids, mask)
