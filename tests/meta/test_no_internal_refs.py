"""No tracked file outside CHANGELOG.md cites an internal issue number or a file a user does not have (the
internal digest and style guide): a reader cannot follow such a reference, so say what it means instead."""

from __future__ import annotations

import re
import subprocess

from dvc_repo import ROOT

# "issue" and a number, also across a line break; the two internal files by name
INTERNAL = re.compile(r"issue\s+[0-9]+|SPEC\.md|STYLE\.md")
ALLOWED = {"CHANGELOG.md"}


def internal_refs(root) -> list[str]:
    """``path:line: text`` of every internal reference in the files git tracks under ``root``."""
    names = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout
    found = []
    for name in sorted(set(names.decode().split("\0")) - {"", *ALLOWED}):
        path = root / name
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # binary files
        for match in INTERNAL.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append(f"{name}:{line}: {text.splitlines()[line - 1].strip()}")
    return found


def test_no_internal_issue_numbers_or_internal_files_are_cited() -> None:
    found = internal_refs(ROOT)
    assert not found, "say what these mean instead of citing internal references:\n" + "\n".join(found)
