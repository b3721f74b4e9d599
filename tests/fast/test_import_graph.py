"""The package's architecture, read from the source (no import is run): no import cycle,
every import goes down the layers the folders name, and no module touches another module's
underscore names.

Every ``import`` counts wherever it sits: at module level, inside a function (a lazy import
is still a dependency, only a later one), in a ``try``, and under ``if TYPE_CHECKING:`` (a
type named from a layer above is still a dependency on it, only one hidden from Python).
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
        edges: set[str] = set()
        for node in ast.walk(tree):
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
    assert f"{NAME}.sae.store" in graph[f"{NAME}.steering.requests"]  # under TYPE_CHECKING


def test_a_cycle_is_found_when_there_is_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


# Each module's layer, bottom first: a module imports only its own layer or those below.
LAYERS = (
    ("errors", "checks", "files", "lru", "version"),  # what every layer shares
    ("runtime",),  # model runtimes and kernels
    ("sae",),  # SAEs, the store, releases, feature indexes
    ("steering",),  # requests, plans, the decode loop, the decoder, results
    ("analysis",),  # activations, concepts, attribution, evaluation
    ("engine",),  # the facade
    ("remote",),  # the engine over a server, beside the facade
    ("widgets",),  # the notebook front end
    ("export", "__main__", ""),  # the package itself, the command line
)


def layer(module: str) -> int:
    top = module.split(".")[1] if "." in module else ""
    for i, names in enumerate(LAYERS):
        if top in names:
            return i
    raise AssertionError(f"{module} is in no layer: add its folder to LAYERS")


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{a} -> {b}" for a, targets in graph.items() for b in targets if layer(b) > layer(a)
    )


def test_every_import_goes_down_the_layers():
    assert upward_imports(import_graph()) == []


def test_an_upward_import_is_found():
    graph = {f"{NAME}.runtime.model": {f"{NAME}.engine"}, f"{NAME}.engine": set()}
    assert upward_imports(graph) == [f"{NAME}.runtime.model -> {NAME}.engine"]


def _owned(tree: ast.AST) -> set[str]:
    """Underscore names a module defines: functions, classes, assignments, attributes it
    sets on anything (``self._x = ...``), and names it imports from outside the package."""
    owned: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            owned.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            owned.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)):
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                owned.add(node.attr)
    return {n for n in owned if n.startswith("_") and not n.startswith("__")}


def reach_ins(sources: dict[str, str]) -> list[str]:
    """``module:line: name`` for each use of an underscore name that another module of the
    package defines: ``x._name`` (``x`` not ``self``/``cls``: a subclass may use its base's)
    and ``from m import _name``. Same-module use (one class reading another instance's
    field) is the module's own business."""
    trees = {m: ast.parse(text) for m, text in sources.items()}
    owned = {m: _owned(t) for m, t in trees.items()}
    everyone = set().union(*owned.values())
    found = []
    for module, tree in trees.items():
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Attribute) and not (
                isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            ):
                names = [node.attr]
            elif isinstance(node, ast.ImportFrom) and node.level:
                names = [a.name for a in node.names]
            for name in names:
                private = name.startswith("_") and not name.startswith("__")
                if (
                    private
                    and name in everyone
                    and (name not in owned[module] or isinstance(node, ast.ImportFrom))
                ):
                    found.append(f"{module}:{node.lineno}: {name}")
    return found


def test_no_module_touches_another_modules_underscore_names():
    sources = {name: path.read_text() for name, path in modules().items()}
    assert reach_ins(sources) == []


def test_a_reach_in_is_found():
    sources = {
        "a": "class Engine:\n    def _decode(self):\n        self._lock = 1\n",
        "b": "def run(engine):\n    engine._decode()\n    with engine._lock:\n        pass\n",
        "c": "from .a import _decode\n",
        "d": "class Remote(Engine):\n    def go(self):\n        self._decode()\n",
    }
    assert reach_ins(sources) == ["b:2: _decode", "b:3: _lock", "c:1: _decode"]
