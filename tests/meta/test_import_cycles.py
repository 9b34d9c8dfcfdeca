"""No import cycle among lmclab's modules. The graph is built from the AST of every module under
src/lmclab, imports inside functions included: a deferred import hides a cycle from Python's import
machinery but not from a reader, and it is one refactoring away from an ImportError at import time. An
edge goes to the module an import names: ``from a import b`` reaches ``a.b`` when that is a module and
``a`` (its ``__init__``) otherwise; a package's ``__init__`` running before its submodules is Python's own
order, not an edge, so a package that re-exports its submodules is no cycle."""

from __future__ import annotations

import ast
from pathlib import Path

from dvc_repo import ROOT

from lmclab.pipeline.closure import module_file

SRC = ROOT / "src" / "lmclab"


def _name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, root: Path) -> set[str]:
    """The lmclab modules that ``path`` (under ``root``, the folder holding ``lmclab``) imports anywhere."""
    name = _name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = f"{package.rsplit('.', node.level - 1)[0]}.{base}".strip(".")
            subs = [f"{base}.{alias.name}" for alias in node.names]
            names = [s for s in subs if module_file(s, [root])] or [base]
        else:
            continue
        found |= {n for n in names if n.split(".")[0] == "lmclab" and module_file(n, [root]) and n != name}
    return found


def cycles(root: Path) -> list[list[str]]:
    """Every strongly connected set of two or more modules, as one cycle through it (Tarjan's algorithm)."""
    graph = {_name(p, root): imports(p, root) for p in sorted((root / "lmclab").rglob("*.py"))}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                out.append(_cycle_through(sorted(component), graph))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _cycle_through(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest path from the component's first module back to itself, inside the component."""
    start, inside = component[0], set(component)
    paths = {start: [start]}
    todo = [start]
    while todo:
        v = todo.pop(0)
        for w in sorted(graph[v] & inside):
            if w == start:
                return [*paths[v], start]
            if w not in paths:
                paths[w] = [*paths[v], w]
                todo.append(w)
    return component


def test_no_import_cycle() -> None:
    found = cycles(SRC.parent)
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_a_planted_cycle_is_found_and_named(tmp_path: Path) -> None:
    """Planted: a -> b at module level, b -> c -> a inside functions; d imports a, outside the cycle."""
    pkg = tmp_path / "lmclab" / "planted"
    pkg.mkdir(parents=True)
    (tmp_path / "lmclab" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from lmclab.planted.a import f\n")
    (pkg / "a.py").write_text("from lmclab.planted import b\n\ndef f():\n    return b\n")
    (pkg / "b.py").write_text("def g():\n    from lmclab.planted.c import h\n    return h\n")
    (pkg / "c.py").write_text("def h():\n    from .a import f\n    return f\n")
    (pkg / "d.py").write_text("import lmclab.planted.a\n")
    assert cycles(tmp_path) == [["lmclab.planted.a", "lmclab.planted.b", "lmclab.planted.c", "lmclab.planted.a"]]
    (pkg / "c.py").write_text("def h():\n    return 1\n")
    assert cycles(tmp_path) == []
