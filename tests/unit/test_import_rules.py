"""DESIGN.md's rooms, checked on the source with `ast` (nothing is imported):

eagle3/        never imports prefect, flows or tasks; never sglang at module level. One exemption:
               eagle3/cli.py, the entry point, imports prefect and flows inside the commands that run
               flows (never at module level). Why it stays there: the `eagle3` console script is the one
               command a user types; its library commands (status, doctor, model, config) run without Prefect,
               and only the commands that are flows reach up to flows/ when they run.
               No import cycles between eagle3/ modules, not even through an import inside a function.
eagle3/train/  (trainer, torchrun worker, launcher, plots) never imports prefect: torchrun runs it bare.
tasks/         never imports flows; tasks/extract/ (the extract flows' tasks) included.
server_patch/  imports nothing of ours except eagle3.dump_protocol, eagle3.sample_format, eagle3.fsio
               (the store-format modules; they run inside SGLang's processes), and never prefect.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OURS = ("eagle3", "flows", "tasks", "server_patch")
#: The only eagle3/ module that may import Prefect or the flows at all, and only inside functions.
ENTRY_POINT = "eagle3/cli.py"
#: What server_patch/ may import of ours (each must itself import nothing of ours beyond this set).
SERVER_PATCH_ALLOWED = {"eagle3.dump_protocol", "eagle3.sample_format", "eagle3.fsio"}


def sources(package: str) -> list[Path]:
    return sorted((REPO / package).rglob("*.py"))


def imports(path: Path, *, module_level_only: bool, root: Path = REPO) -> Iterator[tuple[int, str]]:
    """(line, imported module) of every import in `path`; with module_level_only, those run at import time
    (not inside a function or class body, nor under `if TYPE_CHECKING:`)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = ".".join(path.relative_to(root).with_suffix("").parts[:-1])

    def visit(node: ast.AST) -> Iterator[tuple[int, str]]:
        for child in ast.iter_child_nodes(node):
            if module_level_only and isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                continue
            if module_level_only and isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.Import):
                yield from ((child.lineno, a.name) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:  # relative import: resolve against this package
                    parts = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*parts, base] if base else parts)
                yield (child.lineno, base)
                yield from ((child.lineno, f"{base}.{a.name}") for a in child.names)  # `from eagle3 import x`
            yield from visit(child)

    yield from visit(tree)


def top(module: str) -> str:
    return module.split(".")[0]


def violations(
    package: str, banned: set[str], *, module_level_only: bool, skip: frozenset[str] = frozenset()
) -> list[str]:
    found = []
    for path in sources(package):
        rel = str(path.relative_to(REPO))
        if rel in skip:
            continue
        for line, module in imports(path, module_level_only=module_level_only):
            if top(module) in banned:
                found.append(f"{rel}:{line} imports {module}")
    return sorted(set(found))


def test_the_library_never_imports_prefect_flows_or_tasks() -> None:
    assert violations("eagle3", {"prefect", "flows", "tasks"}, module_level_only=True) == []
    assert (
        violations("eagle3", {"prefect", "flows", "tasks"}, module_level_only=False, skip=frozenset({ENTRY_POINT}))
        == []
    )


def test_the_library_imports_sglang_only_inside_functions() -> None:
    assert violations("eagle3", {"sglang"}, module_level_only=True) == []


def test_tasks_never_import_flows() -> None:
    assert violations("tasks", {"flows"}, module_level_only=False) == []


def test_server_patch_imports_only_the_store_format_modules_of_ours_and_never_prefect() -> None:
    found = []
    for path in sources("server_patch"):
        for line, module in imports(path, module_level_only=False):
            if top(module) in {"eagle3", "flows", "tasks", "prefect"} and module != "eagle3":
                allowed = top(module) == "eagle3" and any(module.startswith(a) for a in SERVER_PATCH_ALLOWED)
                if not allowed:
                    found.append(f"{path.relative_to(REPO)}:{line} imports {module}")
    assert found == []
    for module in SERVER_PATCH_ALLOWED:  # and what they import stays inside the set (or outside our code)
        path = REPO / (module.replace(".", "/") + ".py")
        ours = {m for _, m in imports(path, module_level_only=False) if top(m) in OURS and m != "eagle3"}
        assert all(any(m.startswith(a) for a in SERVER_PATCH_ALLOWED) for m in ours), f"{module} imports {ours}"


def test_the_checker_sees_lazy_type_checking_and_relative_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "eagle3"
    pkg.mkdir()
    (pkg / "bad.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "import prefect.flows\n"
        "from . import store\n"
        "if TYPE_CHECKING:\n    import sglang\n"
        "def f():\n    import tasks.extract\n"
    )
    got = list(imports(pkg / "bad.py", module_level_only=True, root=tmp_path))
    assert (2, "prefect.flows") in got and (3, "eagle3.store") in got and all("sglang" not in m for _, m in got)
    assert (7, "tasks.extract") in list(imports(pkg / "bad.py", module_level_only=False, root=tmp_path))


def module_of(path: Path, root: Path = REPO) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_cycle(package: str, root: Path = REPO) -> list[str]:
    """One cycle of imports between the modules of `package` (any import, lazy ones included), or []."""
    paths = {module_of(p, root): p for p in sorted((root / package).rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        graph[module] = set()
        for _, name in imports(path, module_level_only=False, root=root):
            while name and name not in paths:  # `eagle3.x.Name` -> the module eagle3.x
                name = name.rpartition(".")[0]
            if name and name not in (module, package):
                graph[module].add(name)
    done: set[str] = set()

    def walk(module: str, stack: list[str]) -> list[str]:
        for nxt in sorted(graph[module]):
            if nxt in stack:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in done and (cycle := walk(nxt, [*stack, nxt])):
                return cycle
        done.add(module)
        return []

    for module in sorted(graph):
        if module not in done and (cycle := walk(module, [module])):
            return cycle
    return []


def test_the_new_packages_exist_and_keep_the_rules() -> None:
    assert {p.name for p in sources("eagle3/train")} >= {"__init__.py", "trainer.py", "worker.py", "launch.py"}
    assert {p.name for p in sources("tasks/extract")} >= {"__init__.py", "shards.py", "hold.py", "report.py"}
    assert violations("eagle3/train", {"prefect", "flows", "tasks"}, module_level_only=False) == []
    assert violations("tasks/extract", {"flows"}, module_level_only=False) == []


def test_the_library_has_no_import_cycles() -> None:
    assert import_cycle("eagle3") == []


def test_the_cycle_check_sees_a_cycle_through_a_lazy_import(tmp_path: Path) -> None:
    pkg = tmp_path / "eagle3"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "lock.py").write_text("def f():\n    from eagle3.lease import live\n")
    (pkg / "lease.py").write_text("from eagle3.lock import f\n")
    assert import_cycle("eagle3", root=tmp_path) == ["eagle3.lease", "eagle3.lock", "eagle3.lease"]
