"""The Python package's layers stay layered: nothing imports the command (`ramgrid.cli`, the top), and the modules'
imports of one another form no circle, neither at module level nor through imports deferred into functions.

Read from the source with `ast` (nothing is imported). Imports under `if TYPE_CHECKING:` are for type checkers only and
do not count. Importing `ramgrid.a.b` runs the package `ramgrid.a` first, so it counts as importing that package too;
the root package `ramgrid` imports its public names on first use (its `_LAZY` table), which counts as deferred imports.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(30)

PACKAGE = Path(__file__).resolve().parents[2] / "ramgrid"

# Deferred imports that go up a layer on purpose, with the reason. Each must still exist (so the list stays true).
UPWARD = {
    ("ramgrid.grid", "ramgrid.load"): "Table.load is a shortcut to the loader, which is built on the handles",
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def _target(name: str) -> str | None:
    """The package module `name` is, or is inside (an imported function or class names its module)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(module: str) -> Iterator[tuple[str, bool, int]]:
    """(imported package module, deferred (inside a function), line) for each import of a package module."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def names(node: ast.Import | ast.ImportFrom) -> list[str]:
        if isinstance(node, ast.Import):
            return [a.name for a in node.names]
        base = node.module or ""
        if node.level:
            up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            base = ".".join(up + ([base] if base else []))
        # `from a import b` imports the module a.b when there is one, else a name defined in a.
        return [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]

    def walk(nodes: Iterable[ast.AST], deferred: bool) -> Iterator[tuple[str, bool, int]]:
        for node in nodes:
            if isinstance(node, ast.If) and _is_type_checking(node):
                yield from walk(node.orelse, deferred)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for name in names(node):
                    target = _target(name) if name.split(".")[0] == "ramgrid" else None
                    if target is not None and target != module:
                        yield target, deferred, node.lineno
            else:
                inside = deferred or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                yield from walk(ast.iter_child_nodes(node), inside)

    yield from walk(tree.body, False)
    if module == "ramgrid":
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in node.targets):
                assert isinstance(node.value, ast.Dict)
                for v in node.value.values:
                    assert isinstance(v, ast.Constant)
                    yield str(v.value), True, node.lineno


def _graph(with_deferred: bool) -> dict[str, dict[str, int]]:
    """module -> {imported module: line}, with the packages each import runs first."""
    graph: dict[str, dict[str, int]] = {m: {} for m in MODULES}
    for m in MODULES:
        for target, deferred, line in _imports(m):
            if deferred and not with_deferred:
                continue
            parts = target.split(".")
            # The packages above the target run first; those above `m` itself have run already.
            for i in range(2, len(parts) + 1):
                t = ".".join(parts[:i])
                if t in MODULES and t != m and not m.startswith(t + "."):
                    graph[m].setdefault(t, line)
    return graph


def _cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def _describe(graph: dict[str, dict[str, int]], cycles: list[list[str]]) -> str:
    lines = []
    for comp in cycles:
        lines.append(f"circle of {len(comp)} modules:")
        lines += [f"  {a} -> {b} (line {n})" for a in comp for b, n in sorted(graph[a].items()) if b in comp]
    return "\n".join(lines)


def test_the_reader_sees_each_kind_of_import() -> None:
    top, every = _graph(with_deferred=False), _graph(with_deferred=True)
    assert {"ramgrid", "ramgrid.cli", "ramgrid.grid", "ramgrid.load", "ramgrid.load.run"} <= set(MODULES)
    assert "ramgrid.aio" in top["ramgrid.grid"]  # at module level
    assert "ramgrid.load" in every["ramgrid.grid"] and "ramgrid.load" not in top["ramgrid.grid"]  # in a function
    assert "ramgrid.load" in every["ramgrid.cli"]  # the package that `from ramgrid.load.command import` runs first
    assert "ramgrid.grid" in every["ramgrid"]  # the root's lazy public names
    assert "ramgrid.grid" not in every["ramgrid.aio"]  # aio names Grid under TYPE_CHECKING only


def test_nothing_imports_the_command() -> None:
    importers = [
        f"{m} (line {line})"
        for m in MODULES
        if m != "ramgrid.cli"
        for target, _, line in _imports(m)
        if target == "ramgrid.cli"
    ]
    assert importers == [], f"ramgrid.cli is the top of the package; move what these need below it: {importers}"


def test_module_level_imports_form_no_circle() -> None:
    graph = _graph(with_deferred=False)
    cycles = _cycles(graph)
    assert cycles == [], _describe(graph, cycles)


def test_deferred_imports_form_no_circle_but_the_listed_ones() -> None:
    """An import moved into a function to dodge a circle is still a circle: only the listed upward ones are kept."""
    graph = _graph(with_deferred=True)
    for a, b in UPWARD:
        assert b in graph[a], f"{a} no longer imports {b}: drop it from UPWARD"
        del graph[a][b]
    cycles = _cycles(graph)
    assert cycles == [], _describe(graph, cycles)
