"""Relative imports in lmclab.pipeline.closure, at every depth: ``from . import``, ``from .. import`` and
``from ...pkg import`` in a package three levels deep, named and followed into the closure, each resolved
against the package Python itself gives the file (none given: the top level); and a file that does not
parse is named in the error."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from lmclab.pipeline.closure import _package_of, import_closure, imported_modules


def tree(root: Path) -> Path:
    """``top/mid/low/leaf.py`` importing one level, two levels and three levels up."""
    for package in ("top", "top/mid", "top/mid/low", "top/side"):
        (root / package).mkdir(parents=True, exist_ok=True)
        (root / package / "__init__.py").write_text("")
    (root / "top/mid/low/near.py").write_text("")
    (root / "top/mid/two.py").write_text("")
    (root / "top/side/three.py").write_text("")
    (root / "top/mid/low/leaf.py").write_text(
        "from . import near\nfrom .. import two\nfrom ...side import three\nfrom ..low.near import x\n"
    )
    return root / "top/mid/low/leaf.py"


def test_relative_imports_resolve_at_every_depth(tmp_path: Path) -> None:
    names = set(imported_modules(tree(tmp_path), "top.mid.low"))
    assert {"top.mid.low.near", "top.mid.two", "top.side", "top.side.three", "top.mid.low.near.x"} <= names
    assert not any(n.startswith(("mid", "low", "side", ".")) for n in names)


def test_the_closure_follows_them_into_every_file(tmp_path: Path) -> None:
    leaf = tree(tmp_path)
    found = {p.relative_to(tmp_path.resolve()).as_posix() for p in import_closure(leaf, [tmp_path])}
    expected = {"top/mid/low/leaf.py", "top/mid/low/near.py", "top/mid/two.py", "top/side/three.py"}
    assert expected | {"top/__init__.py", "top/mid/__init__.py", "top/side/__init__.py"} <= found


def test_relative_imports_resolve_against_the_package_python_gives_each_file(tmp_path: Path, monkeypatch) -> None:
    tree(tmp_path)
    (tmp_path / "top/mid/low/peer.py").write_text("")
    (tmp_path / "__init__.py").write_text("")  # a file at a root is a top-level module, whatever its name
    (tmp_path / "script.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    loaded = set(sys.modules)
    try:
        for name, file in [
            ("top.mid.low.peer", "top/mid/low/peer.py"),
            ("top.mid", "top/mid/__init__.py"),
            ("__init__", "__init__.py"),
            ("script", "script.py"),
        ]:
            assert importlib.import_module(name).__package__ == _package_of(tmp_path / file, [tmp_path]), file
    finally:
        for name in set(sys.modules) - loaded:
            del sys.modules[name]


def test_a_file_that_does_not_parse_is_named_in_the_error(tmp_path: Path) -> None:
    broken = tmp_path / "stages" / "broken.py"
    broken.parent.mkdir()
    broken.write_text("import os\ndef f(:\n")
    with pytest.raises(SyntaxError) as raised:
        list(imported_modules(broken))
    assert raised.value.filename == str(broken)
    assert raised.value.lineno == 2


def test_relative_imports_with_no_package_given_resolve_at_the_top_level(tmp_path: Path) -> None:
    """``package`` left out (a file outside any root): ``from .sib import x`` names ``sib``, as at a root."""
    script = tmp_path / "script.py"
    script.write_text("from .sib import x\nfrom ..near import y\n")
    assert list(imported_modules(script)) == ["sib", "sib.x", "near", "near.y"]
    assert list(imported_modules(script)) == list(imported_modules(script, ""))
