"""No import cycle among steer_widgets modules, read from the source (no import is run).

Every ``import`` counts wherever it sits: at module level, inside a function (a lazy import
is still a dependency, only a later one), or in a ``try``. Only imports under
``if TYPE_CHECKING:`` are left out: they never run, they only name types for checkers.
An import of ``a.b.c`` is an edge to ``a.b.c`` alone; the parent packages' ``__init__`` it
runs on the way is Python's package mechanism, not a dependency one module chose.
"""

from __future__ import annotations

import ast
from pathlib import Path

import steer_widgets

PACKAGE = Path(steer_widgets.__file__).parent
NAME = "steer_widgets"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of import nodes under ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                skipped.update(id(n) for n in ast.walk(inner))
    return skipped


def _targets(node: ast.AST, here: str, is_package: bool, known: set[str]) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        base = here.split(".") if is_package else here.split(".")[:-1]
        base = base[: len(base) - node.level + 1]
        stem = ".".join(base + ([node.module] if node.module else []))
    else:
        stem = node.module or ""
    # ``from . import checks`` imports the submodule; ``from .x import name`` imports x
    return [f"{stem}.{a.name}" if f"{stem}.{a.name}" in known else stem for a in node.names]


def import_graph() -> dict[str, set[str]]:
    """module -> the steer_widgets modules it imports."""
    found = modules()
    known = set(found)
    graph: dict[str, set[str]] = {}
    for name, path in found.items():
        tree = ast.parse(path.read_text(), str(path))
        skipped = _type_checking_only(tree)
        edges: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            for target in _targets(node, name, path.name == "__init__.py", known):
                if target in known and target != name:
                    edges.add(target)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a path ``[a, b, ..., a]``, or None (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_graph_sees_the_imports_it_should():
    """The reader is not vacuous: it finds known edges, lazy ones included."""
    graph = import_graph()
    assert len(graph) > 30
    assert f"{NAME}.engine" in graph[f"{NAME}.remote.engine"]  # it subclasses Engine
    assert f"{NAME}.checks" in graph[f"{NAME}.engine"]  # ``from . import checks``
    assert f"{NAME}.widgets" in graph[NAME]  # ``sw.Explorer``: a lazy import in a function
    assert f"{NAME}.sae.store" not in graph[f"{NAME}.steering.requests"]  # TYPE_CHECKING


def test_a_cycle_is_found_when_there_is_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None
