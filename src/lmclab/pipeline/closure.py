"""Static import analysis of the repository's Python files, which keeps the cache and the layers honest:
which files of the repository a script imports, directly or through any chain of imports (imports
inside functions included), and which modules each module names; and each stage's code file (the
closure with MD5s) that the stage depends on. Used by `stages/code.py`, `tools/stage_deps.py` and the
tests that check dvc.yaml's `deps:` and the import contract."""

from __future__ import annotations

import ast
import hashlib
from collections.abc import Iterable, Iterator
from pathlib import Path


def imported_modules(path: Path, package: str | None = None) -> Iterator[str]:
    """Every dotted module name that ``path`` imports anywhere in its body (``from a import b`` yields
    ``a`` and ``a.b``, since ``b`` may be a submodule); ``package`` resolves relative imports."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = (package or "").rsplit(".", node.level - 1)[0]  # level 1: the package itself
                base = f"{parent}.{base}".strip(".")
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names if alias.name != "*")


def module_file(name: str, roots: Iterable[Path]) -> Path | None:
    """The file that ``import name`` runs from one of ``roots`` (a package's ``__init__.py``), or None."""
    for root in roots:
        base = root.joinpath(*name.split("."))
        for candidate in (base / "__init__.py", base.with_suffix(".py")):
            if candidate.is_file():
                return candidate
    return None


def _package_of(path: Path, roots: Iterable[Path]) -> str | None:
    """What ``path``'s relative imports resolve against: the ``__package__`` of the module it is imported as
    from the first of ``roots`` holding it (``a/b/c.py`` and ``a/b/__init__.py``: ``a.b``; at a root: none)."""
    for root in roots:
        if path.is_relative_to(root):
            return ".".join(path.relative_to(root).parts[:-1])
    return None


def import_closure(script: Path, roots: list[Path]) -> set[Path]:
    """``script`` and every file under ``roots`` that importing it may run: each module imported
    anywhere in a file of the closure, and every package ``__init__.py`` on the way to it."""
    seen: set[Path] = set()
    todo = [script.resolve()]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in imported_modules(path, _package_of(path, roots)):
            parts = name.split(".")
            for i in range(1, len(parts) + 1):  # a.b.c runs a/__init__, a/b/__init__, a/b/c
                found = module_file(".".join(parts[:i]), roots)
                if found is not None and found.resolve() not in seen:
                    todo.append(found.resolve())
    return seen


def stage_script(cmd: str) -> str | None:
    """The script a stage's ``cmd`` runs (``python <script> …``), or None."""
    words = cmd.split()
    return words[1] if len(words) > 1 and words[0] in ("python", "python3") and words[1].endswith(".py") else None


def code_closure(repo: Path, script: str) -> set[str]:
    """Repository-relative paths of the files running ``script`` imports (``src/`` and the script's folder)."""
    path = repo / script
    files = import_closure(path, [repo / "src", path.parent])
    return {f.relative_to(repo.resolve()).as_posix() for f in files}


CODE_STAGE = "code"  # the stage that writes every stage's code file


def code_file(stem: str) -> str:
    """The file listing the code of ``stages/<stem>.py``, which that stage depends on (dvc.yaml)."""
    return f"data/code/{stem}.txt"


def code_fingerprint(repo: Path, script: str) -> str:
    """``<md5>  <path>`` for every file of ``script``'s import closure (:func:`code_closure`), sorted:
    equal exactly when the code the script runs is equal."""
    lines = (f"{hashlib.md5((repo / f).read_bytes()).hexdigest()}  {f}\n" for f in sorted(code_closure(repo, script)))
    return "".join(lines)
