"""The import contract of lmclab's packages: each package imports only itself and the packages below
it, so the library's layers stay layers (README "Layout"). Static: every import anywhere in a module,
inside functions too, via src/lmclab/pipeline/closure.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from dvc_repo import ROOT

from lmclab.pipeline.closure import imported_modules

# lowest first: a package may import the packages before it in this list, never one after it
LAYERS = ["core", "trace", "archs", "search", "analysis", "studies", "train", "report", "api", "pipeline", "cli"]
# process plumbing (warm start, whom it trusts, lifetime): for the pipeline's stage scripts only
PRIVATE = {"runtime": {"pipeline"}}
SRC = ROOT / "src" / "lmclab"
ALIASES = {"__main__": "cli"}  # `python -m lmclab` is the command


def _package(path: Path) -> str:
    rel = path.relative_to(SRC)
    name = rel.parts[0].removesuffix(".py") if len(rel.parts) > 1 or rel.name != "__init__.py" else ""
    return ALIASES.get(name, name)


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT / "src").with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


def allowed(importer: str, imported: str) -> bool:
    """May package ``importer`` import package ``imported``?"""
    if importer == imported or imported == "":
        return True
    if imported in PRIVATE:
        return importer in PRIVATE[imported]
    if importer in PRIVATE:
        return False  # the plumbing stands on the standard library alone
    return imported in LAYERS and importer in LAYERS and LAYERS.index(imported) < LAYERS.index(importer)


def violations(files: list[Path]) -> list[str]:
    out = []
    for path in files:
        importer = _package(path)
        package = _module(path) if path.name == "__init__.py" else _module(path).rpartition(".")[0]
        for name in sorted(set(imported_modules(path, package))):
            parts = name.split(".")
            if (
                parts[0] != "lmclab"
                or len(parts) < 2
                or not (SRC / parts[1]).exists()
                and not (SRC / f"{parts[1]}.py").exists()
            ):
                continue
            if not allowed(importer, parts[1]):
                out.append(f"{path.relative_to(ROOT)} ({importer or 'lmclab'}) imports {name}")
    return out


def test_every_package_is_a_layer_of_the_contract() -> None:
    packages = {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    modules = {ALIASES.get(p.stem, p.stem) for p in SRC.glob("*.py") if p.name != "__init__.py"}
    assert packages | modules == set(LAYERS) | set(PRIVATE)


def test_no_package_imports_one_above_it() -> None:
    bad = violations(sorted(SRC.rglob("*.py")))
    assert not bad, "the import contract is broken:\n" + "\n".join(bad)


def test_the_top_level_package_imports_nothing_eagerly() -> None:
    """``import lmclab.core.spec`` must not drag in the whole library: lmclab/__init__.py re-exports
    the API lazily, so the stages' import closures (their DVC deps) stay what they use."""
    assert [n for n in imported_modules(SRC / "__init__.py", "lmclab") if n.startswith("lmclab")] == []


@pytest.mark.parametrize(
    ("importer", "imported", "ok"),
    [
        ("search", "core", True),
        ("core", "search", False),
        ("analysis", "search", True),
        ("report", "pipeline", False),
        ("pipeline", "runtime", True),
        ("cli", "runtime", False),
        ("runtime", "core", False),
        ("core", "core", True),
    ],
)
def test_the_contract_itself(importer: str, imported: str, ok: bool) -> None:
    assert allowed(importer, imported) is ok


def test_a_violation_is_found_and_named(tmp_path: Path) -> None:
    """Planted: a core module importing the search layer inside a function."""
    planted = SRC / "core" / "_planted_for_test.py"
    planted.write_text("def f():\n    from lmclab.search import run_search\n")
    try:
        assert violations([planted]) == [
            "src/lmclab/core/_planted_for_test.py (core) imports lmclab.search",
            "src/lmclab/core/_planted_for_test.py (core) imports lmclab.search.run_search",
        ]
    finally:
        planted.unlink()
