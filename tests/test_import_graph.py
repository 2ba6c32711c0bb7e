"""The modules of ``acetools/`` import one another without a circle (issue #42): the graph is built from the
source's AST, top-level and function-level imports alike (a function-level import only hides a circle), and any
strongly connected set of two or more modules fails the test with the edges that close it.

A node is a module (a package is its ``__init__``); ``from pkg import name`` is an edge to ``pkg.name`` where that
is a module, else to ``pkg``. The package a module sits in is not an edge of its own: Python imports it first, but
a package that imports its submodules is a tree, not a circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def modules(root: Path, package: str = "acetools") -> dict[str, Path]:
    """Dotted module name -> source file, for every ``.py`` under ``root / package``."""
    out = {}
    for p in sorted((root / package).rglob("*.py")):
        parts = list(p.relative_to(root).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def _known(name: str, mods: dict[str, Path]) -> str | None:
    """The longest prefix of ``name`` that is a module of ``mods`` (``None``: not ours)."""
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(root: Path, package: str = "acetools") -> dict[str, dict[str, int]]:
    """module -> {module it imports: line of the first such import}, every import statement of the file."""
    mods = modules(root, package)
    graph: dict[str, dict[str, int]] = {m: {} for m in mods}
    for mod, path in mods.items():
        here = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]  # where `.` points
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                start = here[: len(here) - node.level + 1] if node.level else []
                origin = ".".join(start + ([node.module] if node.module else []))
                names = [f"{origin}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                target = _known(name, mods)
                if target is not None and target != mod:
                    graph[mod].setdefault(target, node.lineno)
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected sets of two or more modules (Tarjan's algorithm, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
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
                    found.append(sorted(comp))
    return found


def describe(graph: dict[str, dict[str, int]], comp: list[str], root: Path) -> str:
    """The edges inside one circle, ``a (file:line) -> b``."""
    mods = modules(root)
    edges = [f"{a} ({mods[a].relative_to(root)}:{graph[a][b]}) -> {b}" for a in comp for b in sorted(graph[a])
             if b in comp]
    return "; ".join(edges)


def test_the_package_has_no_import_circle():
    graph = import_graph(ROOT)
    assert len(graph) > 50 and graph["acetools.merging.ace"], "the walk found the package's modules and imports"
    found = cycles(graph)
    assert not found, "import circles (move what both sides need to the module it belongs to): " + " | ".join(
        describe(graph, c, ROOT) for c in found)


def test_the_walk_sees_a_circle_made_by_a_function_level_import(tmp_path):
    pkg = tmp_path / "acetools"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from . import a\n")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("def f():\n    from .. import c\n")
    (pkg / "c.py").write_text("import acetools.sub.b as b\nfrom .sub.b import f\n")
    graph = import_graph(tmp_path)
    assert graph["acetools"] == {"acetools.a": 1} and graph["acetools.sub.b"] == {"acetools.c": 2}
    assert graph["acetools.c"] == {"acetools.sub.b": 1}
    assert cycles(graph) == [["acetools.c", "acetools.sub.b"]]
    assert "acetools.sub.b (acetools/sub/b.py:2) -> acetools.c" in describe(graph, cycles(graph)[0], tmp_path)
    (pkg / "sub" / "b.py").write_text("")
    assert cycles(import_graph(tmp_path)) == []
