"""docs/scripts.md says in one line what every script of ``tools/`` and ``benchmarks/`` is for: a script added
without its line, or a line left for a script that is gone, fails here."""

from __future__ import annotations

import re

from dvc_repo import ROOT

PAGE = ROOT / "docs" / "scripts.md"
FOLDERS = ("tools", "benchmarks")
SUFFIXES = (".py", ".sh")


def scripts() -> set[str]:
    """Every script of the two folders (their own files, not what a tool installs beside it)."""
    return {f"{folder}/{p.name}" for folder in FOLDERS for p in (ROOT / folder).iterdir() if p.suffix in SUFFIXES}


def indexed(page: str) -> dict[str, str]:
    """The page's table rows: script -> its line."""
    rows = re.findall(r"^\| `((?:tools|benchmarks)/[^`]+)` \| (.+) \|$", page, flags=re.M)
    return dict(rows)


def test_every_script_has_one_line_and_every_line_a_script() -> None:
    found = indexed(PAGE.read_text())
    assert scripts() - set(found) == set(), f"docs/scripts.md: no line for {sorted(scripts() - set(found))}"
    assert set(found) - scripts() == set(), (
        f"docs/scripts.md: lines for missing scripts {sorted(set(found) - scripts())}"
    )
    assert all(line.strip() for line in found.values())


def test_a_script_missing_from_the_index_is_named() -> None:
    page = PAGE.read_text()
    row = next(line for line in page.splitlines() if line.startswith("| `tools/results.py` |"))
    assert "tools/results.py" not in indexed(page.replace(row + "\n", ""))
    assert "tools/results.py" in scripts()
