"""Draw the import graph of `populi_p2p/` by package into docs/architecture.md.

Every import counts: module-level, inside a function (the lazy ones) and under
`TYPE_CHECKING`. Each `populi_p2p` subpackage is one node (`leases.driver` is its own,
apart from the sans-IO `leases`); each top-level module is one node too. Run this after
moving a module or adding an import between packages (tests/test_hygiene.py fails while
the drawing is stale, and on any cycle, between modules or between packages)::

    python scripts/import_graph.py
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOT_PACKAGE = "populi_p2p"
#: Packages outside `populi_p2p` that the drawing shows as the bottom layer.
OUTSIDE = ("swim", "overlay")
#: Subpackages drawn apart from their parent package (the parent's node does not
#: include them).
OWN_NODES = ("populi_p2p.leases.driver",)
BEGIN = "<!-- import graph: begin (python scripts/import_graph.py) -->"
END = "<!-- import graph: end -->"

Graph = dict[str, set[str]]


def _modules(repo: Path) -> dict[str, tuple[Path, bool]]:
    """Each module of the package by dotted name: its file and whether it is a package."""
    found: dict[str, tuple[Path, bool]] = {}
    for path in sorted((repo / ROOT_PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(repo).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        found[".".join(parts)] = (path, is_package)
    return found


def _imported(node: ast.Import | ast.ImportFrom, package: str) -> Iterable[tuple[str, str]]:
    """(module, name) pairs one import statement names; name is "" for `import x`."""
    if isinstance(node, ast.Import):
        return [(alias.name, "") for alias in node.names]
    if node.level:
        base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
        module = ".".join(base + ([node.module] if node.module else []))
    else:
        module = node.module or ""
    return [(module, alias.name) for alias in node.names]


def module_graph(repo: Path = REPO) -> Graph:
    """Module -> the `populi_p2p` modules it imports (and `swim`, `overlay`)."""
    modules = _modules(repo)
    graph: Graph = {name: set() for name in modules}
    for name, (path, is_package) in modules.items():
        package = name if is_package else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for module, attr in _imported(node, package):
                target = f"{module}.{attr}" if f"{module}.{attr}" in modules else module
                if target.split(".")[0] in OUTSIDE:
                    graph[name].add(target.split(".")[0])
                    continue
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def node_of(module: str) -> str:
    """The drawing's node of a module: its subpackage, or itself at the top level."""
    for own in OWN_NODES:
        if module == own or module.startswith(own + "."):
            return own
    parts = module.split(".")
    if parts[0] != ROOT_PACKAGE:
        return parts[0]
    return ".".join(parts[:2]) if len(parts) > 1 else module


def package_graph(graph: Mapping[str, set[str]]) -> Graph:
    """The module graph collapsed to the drawing's nodes (no self-arrows)."""
    collapsed: Graph = {}
    for module, targets in graph.items():
        source = node_of(module)
        collapsed.setdefault(source, set())
        for target in targets:
            collapsed.setdefault(node_of(target), set())
            if node_of(target) != source:
                collapsed[source].add(node_of(target))
    return collapsed


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one member (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(vertex: str) -> None:
        index[vertex] = low[vertex] = len(index)
        stack.append(vertex)
        on_stack.add(vertex)
        for target in sorted(graph.get(vertex, ())):
            if target not in index:
                visit(target)
                low[vertex] = min(low[vertex], low[target])
            elif target in on_stack:
                low[vertex] = min(low[vertex], index[target])
        if low[vertex] == index[vertex]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == vertex:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph) + 100))
    for vertex in sorted(graph):
        if vertex not in index:
            visit(vertex)
    return found


def layers(graph: Mapping[str, set[str]]) -> dict[str, int]:
    """Each node's layer: 0 for one that imports nothing drawn, else one above the
    highest it imports (so every arrow points down). The graph must have no cycle."""
    layer: dict[str, int] = {}

    def height(vertex: str) -> int:
        if vertex not in layer:
            layer[vertex] = 1 + max((height(t) for t in graph.get(vertex, ())), default=-1)
        return layer[vertex]

    for vertex in graph:
        height(vertex)
    return layer


def _short(node: str) -> str:
    if node == ROOT_PACKAGE:
        return f"{ROOT_PACKAGE} (__init__)"
    return node.removeprefix(ROOT_PACKAGE + ".")


def drawing(graph: Mapping[str, set[str]]) -> str:
    """The package graph as a table, top layer first: each node and what it imports."""
    packages = package_graph(graph)
    layer = layers(packages)
    rows = [
        "| layer | package or module | imports |",
        "|---:|---|---|",
    ]
    for node in sorted(packages, key=lambda n: (-layer[n], _short(n))):
        targets = ", ".join(f"`{_short(t)}`" for t in sorted(packages[node], key=_short))
        rows.append(f"| {layer[node]} | `{_short(node)}` | {targets} |")
    return "\n".join(rows) + "\n"


def docs_with_drawing(docs: str, table: str) -> str:
    """`docs` with the text between the markers replaced by `table`."""
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.DOTALL)
    if not pattern.search(docs):
        raise ValueError(f"docs/architecture.md lacks the markers {BEGIN!r} ... {END!r}")
    return pattern.sub(lambda _: f"{BEGIN}\n{table}{END}", docs)


def main() -> None:
    graph = module_graph()
    found = cycles(graph) or cycles(package_graph(graph))
    if found:
        raise SystemExit(f"import cycles: {found}")
    docs = REPO / "docs" / "architecture.md"
    docs.write_text(docs_with_drawing(docs.read_text(), drawing(graph)))
    print(f"rewrote the import graph in {docs.relative_to(REPO)}")


if __name__ == "__main__":
    main()
