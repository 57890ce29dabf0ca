"""The import rules of our code (eagle3/__init__.py draws the packages), checked on the source with `ast` (nothing
is imported):

eagle3/<package>/  imports of ours only what its __init__.py's "May import:" line names (eagle3/__init__.py
               says it for the top-level modules); the packages' rules form no cycle, and neither do the imports.

eagle3/        never imports prefect, flows or tasks, not even inside a function; never sglang at module level.
               The `eagle3` command, whose commands run flows, is flows/cli.py.
               No import cycles between eagle3/ modules, not even through an import inside a function.
eagle3/train/  (trainer, torchrun worker, launcher, plots) never imports prefect: torchrun runs it bare.
tasks/         never imports flows; tasks/extract/ (the extract flows' tasks) included. The glue every flow shares
               (run lock, progress board, events, child launches) sits at the top of tasks/: tasks/extract/ imports
               only those top-level modules and its own, and nothing else in tasks/ imports tasks/extract/.
server_patch/  imports nothing of ours except eagle3.store.dump_protocol, eagle3.store.sample_format, eagle3.store.fsio
               (the store-format modules; they run inside SGLang's processes), and never prefect.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
OURS = ("eagle3", "flows", "tasks", "server_patch")
#: What server_patch/ may import of ours (each must itself import nothing of ours beyond this set).
SERVER_PATCH_ALLOWED = {"eagle3.store.dump_protocol", "eagle3.store.sample_format", "eagle3.store.fsio"}
#: The packages around them, shipped with them into SGLang's environment (deploy/sglang_env.sh): docstrings only.
PLUGIN_PACKAGES = ("eagle3", "eagle3.store")


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


def violations(package: str, banned: set[str], *, module_level_only: bool) -> list[str]:
    found = []
    for path in sources(package):
        rel = str(path.relative_to(REPO))
        for line, module in imports(path, module_level_only=module_level_only):
            if top(module) in banned:
                found.append(f"{rel}:{line} imports {module}")
    return sorted(set(found))


def test_the_library_never_imports_prefect_flows_or_tasks() -> None:
    assert violations("eagle3", {"prefect", "flows", "tasks"}, module_level_only=False) == []


def test_the_library_imports_sglang_only_inside_functions() -> None:
    assert violations("eagle3", {"sglang"}, module_level_only=True) == []


def test_tasks_never_import_flows() -> None:
    assert violations("tasks", {"flows"}, module_level_only=False) == []


def test_server_patch_imports_only_the_store_format_modules_of_ours_and_never_prefect() -> None:
    found = []
    for path in sources("server_patch"):
        for line, module in imports(path, module_level_only=False):
            if top(module) in {"eagle3", "flows", "tasks", "prefect"} and module not in PLUGIN_PACKAGES:
                allowed = top(module) == "eagle3" and any(module.startswith(a) for a in SERVER_PATCH_ALLOWED)
                if not allowed:
                    found.append(f"{path.relative_to(REPO)}:{line} imports {module}")
    assert found == []
    for module in SERVER_PATCH_ALLOWED:  # and what they import stays inside the set (or outside our code)
        path = REPO / (module.replace(".", "/") + ".py")
        ours = {m for _, m in imports(path, module_level_only=False) if top(m) in OURS and m not in PLUGIN_PACKAGES}
        assert all(any(m.startswith(a) for a in SERVER_PATCH_ALLOWED) for m in ours), f"{module} imports {ours}"
    for package in PLUGIN_PACKAGES:  # the packages' __init__ files import nothing that is not shipped
        init = REPO / package.replace(".", "/") / "__init__.py"
        assert list(imports(init, module_level_only=False)) == [], f"{init.relative_to(REPO)} imports something"


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
    assert {p.name for p in sources("tasks/extract")} >= {"__init__.py", "shards.py", "report.py"}
    assert violations("eagle3/train", {"prefect", "flows", "tasks"}, module_level_only=False) == []
    assert violations("tasks/extract", {"flows"}, module_level_only=False) == []


def test_tasks_shared_glue_sits_at_the_top_and_only_the_extract_flows_reach_into_tasks_extract() -> None:
    outside = [p for p in sources("tasks") if "extract" not in p.relative_to(REPO / "tasks").parts[:-1]]
    found = [
        f"{p.relative_to(REPO)}:{line} imports {module}"
        for p in outside
        for line, module in imports(p, module_level_only=False)
        if module == "tasks.extract" or module.startswith("tasks.extract.")
    ]
    assert found == []
    upward = []  # tasks/extract/ imports its own modules or tasks/<module>.py, never another sub-package of tasks/
    for p in sources("tasks/extract"):
        for line, module in imports(p, module_level_only=False):
            parts = module.split(".")
            if parts[0] != "tasks" or parts[:2] == ["tasks", "extract"] or len(parts) == 1:
                continue
            if not (REPO / "tasks" / f"{parts[1]}.py").is_file():
                upward.append(f"{p.relative_to(REPO)}:{line} imports {module}")
    assert upward == []
    flows_in = {
        p.name
        for p in sources("flows")
        for _, m in imports(p, module_level_only=False)
        if m.startswith("tasks.extract")
    }
    assert flows_in <= {"extract.py", "extract_fanout.py", "retry.py"}  # the extract flows, and only they


def test_the_library_has_no_import_cycles() -> None:
    assert import_cycle("eagle3") == []


def test_the_cycle_check_sees_a_cycle_through_a_lazy_import(tmp_path: Path) -> None:
    pkg = tmp_path / "eagle3"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "lock.py").write_text("def f():\n    from eagle3.lease import live\n")
    (pkg / "lease.py").write_text("from eagle3.lock import f\n")
    assert import_cycle("eagle3", root=tmp_path) == ["eagle3.lease", "eagle3.lock", "eagle3.lease"]


# packages by domain -------------------------------------------------------------------------------------------------
LIB = REPO / "eagle3"


def unit_of(module: str) -> str:
    """The package (eagle3.store) or top-level module (eagle3.config) a module of the library belongs to."""
    return ".".join(module.split(".")[:2])


def rules(lib: Path = LIB) -> dict[str, set[str]]:
    """{unit: units it may import}: each package's "May import:" line, and eagle3/__init__.py's table of the
    top-level modules (`name, name:  eagle3.a, eagle3.b`, or `nothing`)."""
    out: dict[str, set[str]] = {}
    for init in sorted(lib.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        _, found, rest = doc.partition("May import:")
        assert found, f"{init.relative_to(lib.parent)}: no 'May import:' line in its docstring"
        out[f"eagle3.{init.parent.name}"] = set(rest.split("\n\n")[0].replace(",", " ").split()) - {"nothing"}
    doc = ast.get_docstring(ast.parse((lib / "__init__.py").read_text())) or ""
    for line in doc.splitlines():
        names, sep, allowed = line.strip().partition(":")
        modules = [n.strip() for n in names.split(",")]
        if sep and all(n.isidentifier() and (lib / f"{n}.py").is_file() for n in modules):
            for n in modules:
                out[f"eagle3.{n}"] = set(allowed.replace(",", " ").split()) - {"nothing"}
    return out


def forbidden_imports(lib: Path = LIB) -> list[str]:
    """Every import of ours (lazy and TYPE_CHECKING ones included) that its unit's rule does not allow, as
    `file:line imports unit`."""
    allowed = rules(lib)
    found = set()
    for path in sorted(lib.rglob("*.py")):
        unit = unit_of(module_of(path, lib.parent))
        if unit == "eagle3":
            continue
        assert unit in allowed, f"{path.relative_to(lib.parent)}: {unit} has no import rule"
        for line, name in imports(path, module_level_only=False, root=lib.parent):
            target = unit_of(name)
            seg = target.partition(".")[2]
            if not seg or not ((lib / seg).is_dir() or (lib / f"{seg}.py").is_file()):
                continue  # eagle3 itself, or a name of its __init__ (`from eagle3 import __version__`)
            if top(name) == "eagle3" and target != unit and target not in allowed[unit]:
                found.add(f"{path.relative_to(lib.parent)}:{line} imports {target}")
    return sorted(found)


def rule_cycle(allowed: dict[str, set[str]]) -> list[str]:
    done: set[str] = set()

    def walk(unit: str, stack: list[str]) -> list[str]:
        for nxt in sorted(allowed.get(unit, set())):
            if nxt in stack:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in done and (cycle := walk(nxt, [*stack, nxt])):
                return cycle
        done.add(unit)
        return []

    for unit in sorted(allowed):
        if unit not in done and (cycle := walk(unit, [unit])):
            return cycle
    return []


def test_every_package_says_what_it_is_for_and_what_it_may_import() -> None:
    packages = sorted(p.parent.name for p in LIB.glob("*/__init__.py"))
    known = [
        "checks",
        "config",
        "convert",
        "data",
        "draft",
        "evaluate",
        "extract",
        "release",
        "serving",
        "store",
        "target",
        "train",
    ]
    assert packages == known
    allowed = rules()
    for name in packages:
        doc = ast.get_docstring(ast.parse((LIB / name / "__init__.py").read_text())) or ""
        assert len(doc.partition("May import:")[0].strip()) > 40, f"eagle3/{name}/__init__.py: no purpose line"
    top_level = sorted(f"eagle3.{p.stem}" for p in LIB.glob("*.py") if p.stem != "__init__")
    assert [m for m in top_level if m not in allowed] == []  # every top-level module has its rule too
    assert all(t in allowed for targets in allowed.values() for t in targets), "a rule names an unknown unit"


def test_each_package_imports_only_what_its_rule_allows() -> None:
    assert forbidden_imports() == []


def test_the_rules_form_no_cycle_and_the_store_is_the_floor() -> None:
    allowed = rules()
    assert rule_cycle(allowed) == []
    assert allowed["eagle3.store"] <= {"eagle3.progress"}  # the store imports nothing above it
    assert "eagle3.data" not in allowed["eagle3.serving"]  # serving knows nothing of the data end
    assert "eagle3.serving" not in allowed["eagle3.draft"] | allowed["eagle3.train"]  # nor the draft of serving


def test_the_rule_checker_catches_a_forbidden_and_a_cyclic_rule(tmp_path: Path) -> None:
    lib = tmp_path / "eagle3"
    for pkg, rule in (("store", "nothing"), ("data", "eagle3.store")):
        (lib / pkg).mkdir(parents=True)
        (lib / pkg / "__init__.py").write_text(
            f'"""The {pkg} package, for the checker\'s own test.\n\nMay import: {rule}\n"""\n'
        )
    (lib / "__init__.py").write_text('"""A library.\n\n    config:  nothing\n"""\n')
    (lib / "config.py").write_text("")
    (lib / "store" / "paths.py").write_text("def f():\n    from eagle3.data.prepare import x\n")
    (lib / "data" / "prepare.py").write_text("from eagle3.store.paths import f\nfrom eagle3.config import y\n")
    found = forbidden_imports(lib)
    assert found == ["eagle3/data/prepare.py:2 imports eagle3.config", "eagle3/store/paths.py:2 imports eagle3.data"]
    assert rule_cycle({"eagle3.a": {"eagle3.b"}, "eagle3.b": {"eagle3.a"}}) == ["eagle3.a", "eagle3.b", "eagle3.a"]
