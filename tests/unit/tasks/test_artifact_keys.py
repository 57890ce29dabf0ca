"""Every artifact the tasks and flows create has a stable key (an unkeyed one is an unnamed card in the UI with
no history): checked on the source with `ast`, for every call that creates an artifact."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
#: Calls that create an artifact, and the position of their key when it is given positionally.
CREATORS = {
    "TaskProgress": None,  # key= only
    "ProgressArtifact": None,  # key=, or artifact_id= to update one that exists
    "create_progress_artifact": None,
    "create_table_artifact": None,
    "create_markdown_artifact": None,
    "create_link_artifact": None,
    "create_image_artifact": None,
    "markdown_artifact": 0,
    "table_artifact": 0,
}


def unkeyed_calls() -> list[str]:
    found = []
    for path in sorted([*(REPO / "tasks").rglob("*.py"), *(REPO / "flows").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            if name not in CREATORS:
                continue
            keywords = {k.arg: k.value for k in node.keywords}
            key = keywords.get("key")
            if key is None and CREATORS[name] is not None and len(node.args) > CREATORS[name]:
                key = node.args[CREATORS[name]]
            keyed = key is not None and not (isinstance(key, ast.Constant) and key.value is None)
            if not keyed and "artifact_id" not in keywords:
                found.append(f"{path.relative_to(REPO)}:{node.lineno} {name}(...) without a key")
    return found


def test_every_artifact_the_tasks_create_has_a_key() -> None:
    assert unkeyed_calls() == []
