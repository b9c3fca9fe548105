"""The package's layout stays readable: no import cycles, no oversized modules.

The import graph is built from the source with ``ast`` (nothing is imported): every ``import``
and ``from ... import`` counts wherever it stands — at module level, inside a function (a lazy
import is still a dependency), or under ``if TYPE_CHECKING:`` (a type-only import still couples
the two modules; a ``Protocol`` in the lower module breaks it). Relative imports are resolved
against the importing module's package. ``from kcms.a import b`` is an edge to ``kcms.a.b`` when
that is a module, else to ``kcms.a``. Importing ``kcms.a.b`` is not counted as importing the
package ``kcms.a`` (every submodule would otherwise depend on its package's ``__init__``).

Modules are discovered by walking ``kcms/``, so the tests keep working when files move (for
example the entry points into ``kcms/cmd/``).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "kcms"

MAX_LINES = 600

# Modules allowed over MAX_LINES, each with the reason. An entry whose file is gone or back under
# the limit fails the test, so the list cannot go stale.
OVERSIZED: dict[str, str] = {}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve_from(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    """The absolute module a ``from X import ...`` names (relative levels resolved)."""
    if node.level == 0:
        return node.module or ""
    base = importer.split(".")
    if not is_package:
        base = base[:-1]  # a plain module's level 1 is its package
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The kcms modules ``name`` imports anywhere in its source."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    found: set[str] = set()

    def add(target: str) -> None:
        # The most specific known module: `kcms.a.b.attr` → `kcms.a.b`.
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name:
            found.add(target)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "kcms" or alias.name.startswith("kcms."):
                    add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve_from(node, name, is_package)
            if base != "kcms" and not base.startswith("kcms."):
                continue
            for alias in node.names:
                full = f"{base}.{alias.name}"
                add(full if full in known else base)
    return found


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports_of(name, path, known) for name, path in mods.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component with more than one module (Tarjan), each as one cycle path."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp: set[str] = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                components.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_one_cycle(graph, comp) for comp in components]


def _one_cycle(graph: dict[str, set[str]], comp: set[str]) -> list[str]:
    """A concrete cycle inside a strongly connected component, to name in the failure."""
    start = min(comp)
    # Breadth-first from start back to start, staying inside the component: the shortest cycle.
    prev: dict[str, str] = {}
    frontier = [start]
    seen = {start}
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & comp):
                if w == start:
                    path = [v]  # walk back from v to start through prev
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return [*reversed(path), start]
                if w not in seen:
                    seen.add(w)
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return sorted(comp)  # unreachable for a real component


def test_import_graph_sees_lazy_and_type_only_imports(tmp_path):
    """The graph builder itself: lazy, TYPE_CHECKING and relative imports are edges; a cycle is named."""
    pkg = tmp_path / "kcms"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from kcms.b import thing\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from kcms.sub import c\n"
    )
    (pkg / "sub" / "c.py").write_text("from .. import a\nfrom .d import x\n")
    (pkg / "sub" / "d.py").write_text("import os\n")
    known = {"kcms", "kcms.a", "kcms.b", "kcms.sub", "kcms.sub.c", "kcms.sub.d"}
    paths = {
        "kcms.a": pkg / "a.py",
        "kcms.b": pkg / "b.py",
        "kcms.sub.c": pkg / "sub" / "c.py",
        "kcms.sub.d": pkg / "sub" / "d.py",
    }
    graph = {name: imports_of(name, path, known) for name, path in paths.items()}
    assert graph == {
        "kcms.a": {"kcms.b"},
        "kcms.b": {"kcms.sub.c"},
        "kcms.sub.c": {"kcms.a", "kcms.sub.d"},
        "kcms.sub.d": set(),
    }
    assert find_cycles(graph) == [["kcms.a", "kcms.b", "kcms.sub.c", "kcms.a"]]
    graph["kcms.sub.c"].discard("kcms.a")
    assert find_cycles(graph) == []


def test_no_import_cycles():
    graph = import_graph()
    assert len(graph) > 50, "the walk found too few kcms modules: is ROOT right?"
    assert graph["kcms.cmd.standalone"], "kcms.cmd.standalone imports other kcms modules: the parser saw none"
    cycles = find_cycles(graph)
    assert not cycles, "import cycles in kcms (each A → B means A imports B):\n" + "\n".join(
        " → ".join(c) for c in cycles
    )


def test_no_module_over_the_line_limit_without_a_reason():
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in modules().values()}
    too_long = {f: n for f, n in sizes.items() if n > MAX_LINES and f not in OVERSIZED}
    assert not too_long, (
        f"modules over {MAX_LINES} lines: {too_long}; split them, or list them in OVERSIZED in "
        "tests/test_layout.py with the reason"
    )
    stale = {f: sizes.get(f) for f in OVERSIZED if sizes.get(f, 0) <= MAX_LINES}
    assert not stale, f"OVERSIZED entries gone or back under {MAX_LINES} lines (remove them): {stale}"
