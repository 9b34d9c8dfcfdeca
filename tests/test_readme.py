"""The README's examples run as written, and its generated blocks are what their committed sources give."""

from __future__ import annotations

import re
import subprocess
import sys

from dvc_repo import ROOT

README = (ROOT / "README.md").read_text()


def _section(title: str) -> str:
    start = README.index(f"\n## {title}")
    return README[start : README.index("\n## ", start + 1)]


def test_the_python_api_example_runs_in_a_fresh_interpreter(tmp_path) -> None:
    (code,) = re.findall(r"```python\n(.*?)```", _section("Python API"), flags=re.S)
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    barrier, acc_mid, reduction = (float(v) for v in proc.stdout.split())
    assert reduction > 0 and barrier == barrier and acc_mid == acc_mid  # numbers, not NaN


def test_the_cli_demo_block_is_generated_from_its_committed_results(tmp_path) -> None:
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import cli_demo
    finally:
        sys.path.remove(str(ROOT / "tools"))
    copy = tmp_path / "README.md"
    copy.write_text(README)
    cli_demo.write_readme(copy)
    assert copy.read_text() == README, "run `python tools/cli_demo.py --readme-only`"
    assert "lmclab match a.pt b.pt --method wm" in _section("The `lmclab` command")
