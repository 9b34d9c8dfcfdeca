"""ruff over the whole repository ([tool.ruff] in pyproject.toml): no lint finding, and every file
formatted as ``ruff format`` writes it. Uses the ruff installed next to this interpreter; the pre-commit
hooks (.pre-commit-config.yaml) pin the same ruff, so a commit and `make test` format alike."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RUFF = Path(sys.executable).parent / "ruff"


def _ruff(*args: str) -> subprocess.CompletedProcess:
    if not RUFF.is_file():
        pytest.fail(f"ruff is not installed next to {sys.executable} (expected {RUFF})")
    return subprocess.run([str(RUFF), *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_check_finds_nothing() -> None:
    proc = _ruff("check", "--no-cache", ".")  # a cached verdict would hide a change in how imports resolve
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_format_would_change_nothing() -> None:
    proc = _ruff("format", "--check", "--no-cache", ".")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_pre_commit_hooks_pin_the_ruff_of_the_lock() -> None:
    (locked,) = re.findall(r"^ruff==(\S+)", (ROOT / "requirements.lock").read_text(), flags=re.MULTILINE)
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    hooks = {hook["id"]: hook for repo in config["repos"] for hook in repo["hooks"]}
    for name in ("ruff-check", "ruff-format"):
        assert hooks[name]["additional_dependencies"] == [f"ruff=={locked}"], name
