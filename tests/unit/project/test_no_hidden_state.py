"""Tasks share no hidden state and the library reads no environment (issue 15, item 3): checked in the source.

- No module of eagle3/, tasks/ or flows/ starts an empty mutable container at module level (`_POOLS = {}`,
  `_LOCKS: dict[...] = {}`, `[]`, `set()`, ...): that is how process-wide registries between tasks begin. What a
  flow run's tasks share is its FlowContext (tasks/flow_context.py), passed to them.
- eagle3/ never reads os.environ / os.getenv: the CLI and the tasks read the environment and pass it in. The
  exceptions read their own process's environment, not a caller's.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
#: Modules that read their own process's environment: torchrun's worker reads its rank (RANK, WORLD_SIZE,
#: LOCAL_RANK: set by torchrun for that process). The edges that read it for everything below them live outside
#: eagle3/: the CLI (flows/cli.py), the tasks, and the project venv's start-up hook (deploy/project_env.py).
ENV_READERS = {"eagle3/train/worker.py"}
#: Module state that belongs to a process, not to tasks: the keeper process's signal handler notes the signal there
#: (a handler has nowhere else to put it).
PROCESS_STATE = {("eagle3/serving/keeper.py", "_stop_signal")}
EMPTY_CALLS = {"dict", "list", "set", "defaultdict", "OrderedDict", "WeakValueDictionary", "WeakKeyDictionary"}


def sources(*folders: str) -> list[Path]:
    return sorted(p for f in folders for p in (ROOT / f).rglob("*.py"))


def rel(p: Path) -> str:
    return p.relative_to(ROOT).as_posix()


def empty_container(node: ast.expr | None) -> bool:
    if isinstance(node, (ast.Dict, ast.List, ast.Set)):
        return not (getattr(node, "keys", None) or getattr(node, "elts", None))
    if isinstance(node, ast.Call) and not node.args and not node.keywords:
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        return name in EMPTY_CALLS
    return False


def env_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) of every `os.environ` / `os.getenv` / `from os import environ|getenv` in `tree`."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os":
            if node.attr in ("environ", "environb", "getenv", "getenvb", "putenv"):
                out.append((node.lineno, f"os.{node.attr}"))
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            out += [(node.lineno, f"from os import {a.name}") for a in node.names if "env" in a.name]
    return out


def test_no_module_keeps_a_registry_between_tasks() -> None:
    found = []
    for path in sources("eagle3", "tasks", "flows"):
        for node in ast.parse(path.read_text(), str(path)).body:
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, ast.AnnAssign)
                else []
            )
            names = {t.id for t in targets if isinstance(t, ast.Name)}
            if empty_container(value) and not {(rel(path), n) for n in names} <= PROCESS_STATE:
                found.append(f"{rel(path)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "module-level registries (pass a FlowContext instead, tasks/flow_context.py):\n" + "\n".join(
        found
    )


def test_the_library_takes_its_environment_as_an_argument() -> None:
    found = []
    for path in sources("eagle3"):
        if rel(path) in ENV_READERS:
            continue
        found += [f"{rel(path)}:{line}: {what}" for line, what in env_reads(ast.parse(path.read_text(), str(path)))]
    assert not found, "eagle3/ reads the environment (take it as an argument; the CLI or task passes it):\n" + (
        "\n".join(found)
    )
