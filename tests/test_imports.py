"""The package's imports go one way: no module imports, directly or through others, a module that
imports it back. Every import counts, those inside functions and under ``TYPE_CHECKING`` too."""

from __future__ import annotations

import ast
from pathlib import Path

import multigpu

PACKAGE = Path(multigpu.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The package's modules that ``path`` imports (a name imported from a module counts as that module)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    return {module_name(p): imports_of(p, modules) for p in paths}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_imports_inside_functions():
    graph = import_graph()
    assert "multigpu.grading.grader" in graph["multigpu.grading.regrade"]
    assert "multigpu.running.launch" in graph["multigpu.running.hvdtools"]  # imported inside a function there


def test_circles_are_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_imports_itself_back_through_others():
    found = circles(import_graph())
    assert not found, "import circles (make one side depend on the other only): " + "; ".join(
        " <-> ".join(group) for group in found)


#: The layers, lowest first: a module imports only from its own layer or the ones before it (a
#: lab only from labs numbered no higher than its own). docs/architecture.md explains each.
LAYERS = (
    ("multigpu.core",),
    ("multigpu.running",),
    ("multigpu.labs.lab1",), ("multigpu.labs.lab2",), ("multigpu.labs.lab3",), ("multigpu.labs.lab4",),
    ("multigpu.labs.lab5",),
    ("multigpu.figures",),
    ("multigpu.grading",),
    ("multigpu.credential",),
    ("multigpu.course", "multigpu.workshop"),
    ("multigpu.cli",),
)


def layer_of(module: str) -> int | None:
    """The index of the layer ``module`` belongs to; None for the package's and a layer package's
    own ``__init__`` (docstrings only, they import nothing)."""
    for rank, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return rank
    return None


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for module, targets in sorted(graph.items()):
        rank = layer_of(module)
        for target in sorted(targets):
            to = layer_of(target)
            if rank is not None and to is not None and to > rank:
                found.append(f"{module} -> {target}")
    return found


def test_every_module_belongs_to_a_layer():
    loose = [m for m in import_graph() if layer_of(m) is None and m not in (
        "multigpu", "multigpu.labs")]
    assert not loose, f"modules outside every layer (move them into one, or add the layer to LAYERS): {loose}"


def test_an_upward_import_is_found():
    graph = {"multigpu.core.models": {"multigpu.grading.grader"}, "multigpu.grading.grader": {"multigpu.core.models"}}
    assert upward_imports(graph) == ["multigpu.core.models -> multigpu.grading.grader"]
    assert upward_imports({"multigpu.labs.lab2.ring": {"multigpu.labs.lab4.links"}}) == [
        "multigpu.labs.lab2.ring -> multigpu.labs.lab4.links"]


def test_imports_go_down_the_layers_only():
    found = upward_imports(import_graph())
    assert not found, "imports that go up a layer (move the code down, or pass it in): " + "; ".join(found)
