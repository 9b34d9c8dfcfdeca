"""ruff over the whole repository ([tool.ruff] in pyproject.toml): no lint finding, and every file
formatted as ``ruff format`` writes it. Uses the ruff installed next to this interpreter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RUFF = Path(sys.executable).parent / "ruff"


def _ruff(*args: str) -> subprocess.CompletedProcess:
    if not RUFF.is_file():
        pytest.fail(f"ruff is not installed next to {sys.executable} (expected {RUFF})")
    return subprocess.run([str(RUFF), *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_check_finds_nothing() -> None:
    proc = _ruff("check", ".")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_format_would_change_nothing() -> None:
    proc = _ruff("format", "--check", ".")
    assert proc.returncode == 0, proc.stdout + proc.stderr
