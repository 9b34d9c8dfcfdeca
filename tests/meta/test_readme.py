"""The README's and the docs' examples run as written, and their generated blocks are what their committed
sources give."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from dvc_repo import ROOT

README = (ROOT / "README.md").read_text()
API_PAGE = (ROOT / "docs" / "api.md").read_text()


def _section(title: str) -> str:
    start = README.index(f"\n## {title}")
    return README[start : README.index("\n## ", start + 1)]


def _runs_and_prints_numbers(code: str, tmp_path) -> None:
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    barrier, acc_mid, reduction = (float(v) for v in proc.stdout.split())
    assert reduction > 0 and barrier == barrier and acc_mid == acc_mid  # numbers, not NaN


def test_the_python_api_example_runs_in_a_fresh_interpreter(tmp_path) -> None:
    (code,) = re.findall(r"```python\n(.*?)```", _section("Python API"), flags=re.S)
    _runs_and_prints_numbers(code, tmp_path)


def test_the_docs_python_api_example_runs_in_a_fresh_interpreter(tmp_path) -> None:
    (code,) = re.findall(r"```python\n(.*?)```", API_PAGE, flags=re.S)
    _runs_and_prints_numbers(code, tmp_path)


@pytest.mark.parametrize(
    ("marker", "count"),
    [
        ("trace", "len(spec.groups)"),  # resnet18: one group per residual stream and per block's inner layer
        ("gpt.Config", "len(alignment.perm)"),  # the language model's stream, attention and MLP groups
    ],
)
def test_the_examples_of_the_architectures_page_run_in_a_fresh_interpreter(tmp_path, marker, count) -> None:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "architectures.md").read_text(), flags=re.S)
    (code,) = [b for b in blocks if marker in b and (marker != "trace" or "gpt" not in b)]
    proc = subprocess.run([sys.executable, "-c", f"{code}print({count})"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert int(proc.stdout) > 1


@pytest.mark.parametrize("page", ["docs/cli.md"])
def test_the_cli_demo_block_is_generated_from_its_committed_results(page, tmp_path) -> None:
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import cli_demo
    finally:
        sys.path.remove(str(ROOT / "tools"))
    assert ROOT / page in cli_demo.PAGES
    text = (ROOT / page).read_text()
    copy = tmp_path / "page.md"
    copy.write_text(text)
    cli_demo.write_block(copy)
    assert copy.read_text() == text, "run `python tools/cli_demo.py --pages-only`"
    assert "$ lmclab match a.pt b.pt --method wm" in text
