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

Message = dict[str, str]  # {"role": "system" | "user" | "assistant", "content": str}
RowFormat = Literal["auto", "sharegpt", "openai"]

ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
}
_KEYS = {"sharegpt": "conversations", "openai": "messages"}
_SENTINEL = "\ue000eagle3-assistant-{}\ue001"  # private-use code points: no template or text contains them


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


def normalize_row(row: Mapping[str, Any], fmt: RowFormat = "auto") -> list[Message]:
    """A ShareGPT (`conversations`: from/value) or OpenAI (`messages`: role/content) row -> messages.

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
        if role is None:
            raise RowError(f"unknown role {raw_role!r} in message {i} (expected one of {sorted(ROLES)})")
        content = _field(msg, "content", "value")
        if not isinstance(content, str):
            raise RowError(f"content not a string in message {i} ({role}): got {type(content).__name__}")
        try:
            content.encode("utf-8")
        except UnicodeEncodeError as e:
            raise RowError(f"content not decodable in message {i} ({role}): {e.reason} at {e.start}") from None
        if not content.strip():
            raise RowError(f"empty content in message {i} ({role})")
        messages.append({"role": role, "content": content})
    if not any(m["role"] == "assistant" for m in messages):
        raise RowError("no assistant turn")
    return messages


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

    def __init__(self, tokenizer: Any, name: str = "tokenizer"):
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
    def from_model_dir(cls, model_dir: Path) -> ChatTokenizer:
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(model_dir), name=str(model_dir))

    def render(self, messages: list[Message], add_generation_prompt: bool = False) -> str:
        try:
            text = self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=add_generation_prompt
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

    def assistant_spans(self, messages: list[Message]) -> tuple[str, list[tuple[int, int]]]:
        """The rendered text and the [start, end) character spans that go into the loss."""
        text = self.render(messages)
        marked = [
            {"role": m["role"], "content": _SENTINEL.format(k)} if m["role"] == "assistant" else m
            for k, m in enumerate(messages)
        ]
        if any("\ue000" in m["content"] for m in messages):
            raise RowError("content contains private-use character U+E000 used as the loss-mask sentinel")
        chunks: list[str] = []
        rest = self.render(marked)
        order = [k for k, m in enumerate(messages) if m["role"] == "assistant"]
        for k in order:
            head, sep, rest = rest.partition(_SENTINEL.format(k))
            if not sep:
                raise RowError(f"chat template did not print assistant message {k}; cannot build the loss mask")
            chunks.append(head)
        chunks.append(rest)
        spans: list[tuple[int, int]] = []
        pos = 0
        for n, k in enumerate(order):
            if not text.startswith(chunks[n], pos):
                raise RowError(f"chat template renders message {k} differently with other content; no loss mask")
            pos += len(chunks[n])
            content = messages[k]["content"]
            for shown in (content, content.strip(), content.lstrip(), content.rstrip()):
                if text.startswith(shown, pos) and text.startswith(chunks[n + 1], pos + len(shown)):
                    break
            else:
                raise RowError(f"cannot locate assistant message {k} in the rendered template text; no loss mask")
            end = pos + len(shown)
            eot = self._leading_special(chunks[n + 1])
            spans.append((pos, end + (len(eot) if eot else 0)))
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
