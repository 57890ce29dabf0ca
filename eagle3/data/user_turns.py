"""The target writing as the user: what it is asked, and how its text becomes a user message.

    request_messages(topic, task, fmt)  the chat turns that ask the target to write one user request (the prompts
                                        stage's self-instruct, eagle3/data/prompts.py)
    next_user_messages(conversation)    the chat turns that ask the target for the user's next message in a
                                        conversation (synthesize.user_turns: multi-turn samples)
    clean_user_text(text)               the written message without labels and quotes ("" when nothing is left)
    sample_seed(seed, key, turn)        the seed of one generated turn: a function of the sample, never of the batch

Both engines render these turns with the data's chat template and generate them like any answer, so the target
writes in its own distribution; the user turns are never in the loss (prepare masks every non-assistant turn).
"""

from __future__ import annotations

import hashlib
import re

from eagle3.data.chat import Message

REQUEST_INSTRUCTION = (
    "Write one message that a user might send to an AI assistant. The message is about {topic}; in it the user "
    "asks the assistant to {task}, {format}. Write only the user's message itself, as the user would type it, "
    "with any text it refers to included. Do not answer it."
)
NEXT_USER_INSTRUCTION = (
    "Here is a conversation between a user and an AI assistant.\n\n{transcript}\n\n"
    "Write the user's next message: a natural follow-up question or request that continues this conversation. "
    "Write only the message itself, as the user would type it. Do not answer it."
)
_LABEL = re.compile(
    r"^\s*(\*\*)?(the\s+)?(user'?s?\s+)?(next\s+)?(message|request|user|question|prompt)(\*\*)?\s*:\s*(\*\*)?\s*",
    re.IGNORECASE,
)
_QUOTES = ('"', "'", "“", "”", "«", "»")


def request_messages(topic: str, task: str, fmt: str) -> list[Message]:
    return [{"role": "user", "content": REQUEST_INSTRUCTION.format(topic=topic, task=task, format=fmt)}]


def transcript(conversation: list[Message]) -> str:
    names = {"user": "User", "assistant": "Assistant"}
    return "\n\n".join(f"{names[m['role']]}: {m['content']}" for m in conversation if m["role"] in names)


def next_user_messages(conversation: list[Message]) -> list[Message]:
    return [{"role": "user", "content": NEXT_USER_INSTRUCTION.format(transcript=transcript(conversation))}]


def clean_user_text(text: str) -> str:
    """Strip a leading label ("User:", "Message:", "**Request:**") and quotes around the whole text."""
    text = _LABEL.sub("", text.strip(), count=1).strip()
    if len(text) >= 2 and text[0] in _QUOTES and text[-1] in _QUOTES:
        text = text[1:-1].strip()
    return text


def sample_seed(seed: int, key: str, turn: int) -> int:
    """A 63-bit seed from (config seed, sample key, turn): the same sample draws the same tokens in any batch."""
    return int(hashlib.sha256(f"{seed}\0{key}\0{turn}".encode()).hexdigest()[:15], 16)
