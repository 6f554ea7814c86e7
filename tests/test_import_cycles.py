"""No import cycle among gpubench's core modules (suite/): each module can be read, imported and
tested after the ones it imports, and none hides a cycle behind an import inside a function.

Every import in suite/ is read with ast, top level and function-local alike (only those under
``if TYPE_CHECKING:`` are left out: they never run), resolved to the suite module it loads, and the
graph's strongly connected components are found; a failure names each cycle with the file:line of
every import on it.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

SUITE = Path(__file__).resolve().parents[1] / "suite"
PACKAGE = "gpubench"


@dataclass(frozen=True)
class Edge:
    importer: str
    imported: str
    where: str  # file:line, and the function an import inside one is in


def module_names(root: Path) -> dict[str, Path]:
    """Every module under ``root`` by its dotted name (a package by its own name)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join([PACKAGE, *parts])] = path
    return out


def _is_type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return (
        isinstance(node, ast.If)
        and isinstance(test, (ast.Name, ast.Attribute))
        and (getattr(test, "id", None) or getattr(test, "attr", None)) == "TYPE_CHECKING"
    )


def _imports(node: ast.AST, function: str | None = None):
    """(import node, the function it is in or None) for every import that can run."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node, function
        return
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        function = node.name
    for child in node.orelse if _is_type_checking(node) else ast.iter_child_nodes(node):
        yield from _imports(child, function)


def _targets(node: ast.Import | ast.ImportFrom, importer: str, is_package: bool, modules: dict) -> set[str]:
    """The suite modules an import loads: ``from gpubench.x import y`` loads gpubench.x.y if that is a
    module, else gpubench.x."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = importer.split(".") if is_package else importer.split(".")[:-1]
            base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
    out = set()
    for name in names:
        while name and name not in modules:  # `import gpubench.x.y` with y a name: gpubench.x
            name = name.rpartition(".")[0]
        if name:
            out.add(name)
    return out


def import_graph(root: Path = SUITE) -> dict[str, list[Edge]]:
    modules = module_names(root)
    graph: dict[str, list[Edge]] = {name: [] for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node, function in _imports(tree):
            where = f"{path.relative_to(root.parent)}:{node.lineno}" + (f" (in {function})" if function else "")
            for target in _targets(node, name, path.name == "__init__.py", modules) - {name}:
                graph[name].append(Edge(name, target, where))
    return graph


def cycles(graph: dict[str, list[Edge]]) -> list[tuple[set[str], list[Edge]]]:
    """Per strongly connected component of more than one module (or of one that imports itself):
    its modules, and one shortest cycle through them (its edges, in order)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[set[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for edge in graph[v]:
            w = edge.imported
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                component.add(w)
                if w == v:
                    break
            components.append(component)

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph) + 100))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    found = []
    for component in components:
        start = min(component)
        if len(component) > 1 or any(e.imported == start for e in graph[start]):
            found.append((component, _cycle_through(graph, component, start)))
    return found


def _cycle_through(graph: dict[str, list[Edge]], component: set[str], start: str) -> list[Edge]:
    """A shortest cycle from ``start`` back to it inside ``component`` (breadth first)."""
    came_from: dict[str, Edge] = {}
    frontier = [start]
    while frontier:
        following = []
        for v in frontier:
            for edge in graph[v]:
                if edge.imported == start:
                    path = [edge]
                    while path[0].importer != start:
                        path.insert(0, came_from[path[0].importer])
                    return path
                if edge.imported in component and edge.imported not in came_from:
                    came_from[edge.imported] = edge
                    following.append(edge.imported)
        frontier = following
    raise AssertionError(f"no cycle through {start} in {sorted(component)}")


def describe(component: set[str], cycle: list[Edge]) -> str:
    text = " -> ".join([cycle[0].importer] + [f"{e.imported} [{e.where}]" for e in cycle])
    if len(component) > len(cycle):
        text += f"; and more cycles among {', '.join(sorted(component))}"
    return text


def test_gpubench_core_modules_import_no_cycle():
    found = [describe(*c) for c in cycles(import_graph())]
    assert found == [], (
        "import cycles among gpubench's core modules (break each by moving what both sides "
        "need into a module of its own):\n" + "\n".join(found)
    )


# -- the checker itself: a cycle is found wherever its imports hide ---------------------------------


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "suite"
    for rel, text in {"__init__.py": "", **files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_a_cycle_hidden_in_a_function_local_import_is_found_and_named(tmp_path):
    root = _tree(
        tmp_path,
        {
            "a.py": "from gpubench import b\n",
            "b.py": "import os\n\ndef late():\n    from gpubench.c import thing\n",
            "c.py": "from . import a\n",
            "d.py": "from gpubench import a\n",
        },
    )  # imports the cycle, is not on it
    assert [describe(*c) for c in cycles(import_graph(root))] == [
        "gpubench.a -> gpubench.b [suite/a.py:1] -> gpubench.c [suite/b.py:4 (in late)] -> gpubench.a [suite/c.py:1]"
    ]


def test_subpackages_relative_imports_and_names_resolve_to_their_module(tmp_path):
    root = _tree(
        tmp_path,
        {
            "serving/__init__.py": "",
            "serving/engine.py": "from ..stats import median\nfrom .kv import Cache\n",
            "serving/kv.py": "import gpubench.stats\n",
            "stats.py": "from gpubench.serving import engine\n",
        },
    )
    ((component, cycle),) = cycles(import_graph(root))
    assert component == {"gpubench.stats", "gpubench.serving.engine", "gpubench.serving.kv"}
    assert [(e.importer, e.imported) for e in cycle] == [
        ("gpubench.serving.engine", "gpubench.stats"),
        ("gpubench.stats", "gpubench.serving.engine"),
    ]


def test_imports_that_never_run_are_no_cycle(tmp_path):
    root = _tree(
        tmp_path,
        {
            "a.py": "from gpubench import b\n",
            "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gpubench import a\n",
        },
    )
    assert cycles(import_graph(root)) == []
