"""No import cycles in library code: neither between files nor between subpackages.

A cycle makes import order matter and hides which piece is the leaf; the fix is to move the shared piece down
into a module both sides can import (or to invert the dependency), never to hide the import inside a function.
So every ``import`` counts, at module level and inside functions, except those under ``if TYPE_CHECKING:``,
which never run.

A subpackage is the first level under a top package: ``skyrl_gym.tools.sql`` belongs to ``skyrl_gym.tools``,
``skyrl_gym.metrics`` is its own. Each top package's ``__init__`` is its public front door and re-exports from
every subpackage, so it stays out of the subpackage graph (it is still a file in the file graph).
"""

from __future__ import annotations

import ast
import functools
from collections import defaultdict, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = {
    "skyrl_gym": REPO / "skyrl-gym" / "skyrl_gym",
    "skyrl_train": REPO / "skyrl-train" / "skyrl_train",
    "skyrl_agent": REPO / "skyrl-agent" / "skyrl_agent",
}
SKIPPED_DIRS = {"tests", "benchmarks", "build", "__pycache__"}
# Pairs (importer, imported) of subpackages or modules allowed to close a cycle. Empty, and meant to stay so: the
# one known pair, skyrl_gym.core ↔ skyrl_gym.envs.registration, is type-only and the scan skips TYPE_CHECKING.
ALLOWED: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class Edge:
    """One import statement of ``source`` that reaches ``target``."""

    source: str
    target: str
    where: str  # "path:line"
    statement: str


def _module_name(top: str, root: Path, path: Path) -> str:
    parts = [top, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _library_files() -> dict[str, Path]:
    files: dict[str, Path] = {}
    for top, root in PACKAGES.items():
        for path in root.rglob("*.py"):
            if not SKIPPED_DIRS.intersection(path.relative_to(root).parts):
                files[_module_name(top, root, path)] = path
    return files


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(nodes: Iterable[ast.AST]) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement in ``nodes``, at any depth, except the bodies of ``if TYPE_CHECKING:``."""
    for node in nodes:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node):
            yield from _runtime_imports(node.orelse)
        else:
            yield from _runtime_imports(ast.iter_child_nodes(node))


def _absolute_base(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _targets(module: str, is_package: bool, node: ast.Import | ast.ImportFrom, known: set[str]) -> set[str]:
    """The library modules an import statement loads: ``from a.b import c`` means a.b.c if c is a module."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = _absolute_base(module, is_package, node)
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
    found = set()
    for name in names:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name:
            found.add(name)
    return found


def _edges(files: dict[str, Path]) -> list[Edge]:
    known = set(files)
    edges = []
    for module, path in files.items():
        source = path.read_text()
        lines = source.splitlines()
        for node in _runtime_imports(ast.parse(source, str(path)).body):
            statement = " ".join(lines[node.lineno - 1 : node.end_lineno])
            for target in _targets(module, path.name == "__init__.py", node, known) - {module}:
                where = f"{path.relative_to(REPO)}:{node.lineno}"
                edges.append(Edge(module, target, where, " ".join(statement.split())))
    return edges


@functools.cache
def _library_edges() -> tuple[Edge, ...]:
    return tuple(_edges(_library_files()))


def _subpackage(module: str) -> str | None:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else None


def _subpackage_edges(edges: Iterable[Edge]) -> list[Edge]:
    lifted = []
    for edge in edges:
        source, target = _subpackage(edge.source), _subpackage(edge.target)
        if source and target and source != target:
            lifted.append(Edge(source, target, edge.where, f"{edge.source}: {edge.statement}"))
    return lifted


def _graph(edges: Iterable[Edge]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for edge in edges:
        if (edge.source, edge.target) not in ALLOWED:
            graph[edge.source].add(edge.target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while (top := stack.pop()) != node:
                component.append(top)
            components.append(sorted([*component, node]))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(c for c in components if len(c) > 1)


def _shortest_loop(start: str, members: set[str], graph: dict[str, set[str]]) -> list[str]:
    """The shortest chain of imports from ``start`` back to itself inside one component (breadth first)."""
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt in sorted(graph[node] & members):
            if nxt == start:
                chain = [node]
                while chain[-1] != start:
                    chain.append(came_from[chain[-1]])
                return [*reversed(chain), start]
            if nxt not in came_from:
                came_from[nxt] = node
                queue.append(nxt)
    raise AssertionError(f"{start} is on no cycle")


def _describe(component: list[str], graph: dict[str, set[str]], edges: Iterable[Edge]) -> str:
    """The component, one loop through it as a chain, and every import line between its members."""
    members = set(component)
    lines = [" ↔ ".join(component), "  for example " + " → ".join(_shortest_loop(component[0], members, graph))]
    for edge in sorted(edges, key=lambda e: (e.source, e.target, e.where)):
        if edge.source in members and edge.target in members and (edge.source, edge.target) not in ALLOWED:
            lines.append(f"    {edge.source} → {edge.target}  ({edge.where}: {edge.statement})")
    return "\n".join(lines)


def _report(kind: str, edges: Iterable[Edge]) -> str:
    edges = list(edges)
    graph = _graph(edges)
    cycles = _cycles(graph)
    if not cycles:
        return ""
    body = "\n".join(_describe(component, graph, edges) for component in cycles)
    return f"{len(cycles)} {kind} import cycle(s); move the shared piece down into a leaf module:\n{body}"


def test_no_import_cycles_between_files() -> None:
    report = _report("file-level", _library_edges())
    if report:
        pytest.fail(report, pytrace=False)


def test_no_import_cycles_between_subpackages() -> None:
    report = _report("subpackage", _subpackage_edges(_library_edges()))
    if report:
        pytest.fail(report, pytrace=False)


SNIPPET = """
from typing import TYPE_CHECKING
import pkg.a.b
from . import sibling, CONSTANT
from ..c import thing
if TYPE_CHECKING:
    from pkg.hidden import Hint
else:
    from pkg.shown import Value
def late():
    from pkg.late import helper
"""


def test_the_scan_counts_every_runtime_import_and_resolves_it() -> None:
    known = {"pkg", "pkg.a", "pkg.a.b", "pkg.c", "pkg.x", "pkg.x.sibling", "pkg.hidden", "pkg.shown", "pkg.late"}
    found: set[str] = set()
    for node in _runtime_imports(ast.parse(SNIPPET).body):
        found |= _targets("pkg.x.mod", False, node, known)
    assert found == {"pkg.a.b", "pkg.x", "pkg.x.sibling", "pkg.c", "pkg.shown", "pkg.late"}


def test_the_scan_sees_the_library() -> None:
    assert {"skyrl_gym.core", "skyrl_agent.dispatch.dispatcher", "skyrl_train.trainer"} <= set(_library_files())
    pairs = {(edge.source, edge.target) for edge in _library_edges()}
    assert ("skyrl_agent.dispatch.dispatcher", "skyrl_agent.llm.base") in pairs
    assert ("skyrl_gym.core", "skyrl_gym.envs.registration") not in pairs  # imported under TYPE_CHECKING only
