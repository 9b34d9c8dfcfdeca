"""The README's ``lmclab`` commands run as written, in an empty folder outside the repository, offline:
three torchvision resnet18 state dicts, a module of the user's own for ``trace``, the repository's
params.yaml for ``validate``, and the offline digits (``mnist5k``)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from dvc_repo import ROOT

MYPKG = """
from torch import nn


def make_net():
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
"""


def _commands(page: str, section: str) -> list[str]:
    """The ``lmclab`` lines of the bash block under ``section``, continuations joined, comments dropped."""
    text = page[page.index(section) :]
    (block,) = re.findall(r"```bash\n(.*?)```", text, flags=re.S)[:1]
    lines = block.replace("\\\n", " ").splitlines()
    return [" ".join(line.split("#")[0].split()) for line in lines if line.strip()]


@pytest.mark.slow
def test_the_readme_commands_run_as_written_in_an_empty_folder(tmp_path: Path) -> None:
    from torchvision.models import resnet18

    for seed, name in enumerate(("a.pt", "b.pt", "c.pt")):
        torch.manual_seed(seed)
        torch.save(resnet18(num_classes=10).state_dict(), tmp_path / name)
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "models.py").write_text(MYPKG)
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    before = set(os.listdir(tmp_path))
    commands = _commands((ROOT / "README.md").read_text(), "## The `lmclab` command")
    assert [c.split()[1] for c in commands] == ["match", "merge", "merge-many", "barrier", "trace", "validate"]
    script = Path(sys.executable).parent / "lmclab"
    source = [p for p in sys.path if p.endswith("src")]  # this checkout's library, as tests/cli/test_cli.py runs it
    path = f"{script.parent}{os.pathsep}{os.environ['PATH']}"
    env = {**os.environ, "PATH": path, "PYTHONPATH": os.pathsep.join([str(tmp_path), *source])}
    for command in commands:
        proc = subprocess.run(command, shell=True, cwd=tmp_path, capture_output=True, text=True, env=env)
        assert proc.returncode == 0, f"{command}\n{proc.stdout}\n{proc.stderr[-1500:]}"
        assert "warning:" not in proc.stderr, f"{command}\n{proc.stderr}"  # the 10-way heads fit the digits
    written = set(os.listdir(tmp_path)) - before
    assert written == {"perm.pt", "merged.safetensors", "many.safetensors", "aligned.json"}  # nothing else left


def _console(page: str) -> list[tuple[str, list[str]]]:
    """The ``$ lmclab`` commands of the page's first console block, each with the lines it printed."""
    (block,) = re.findall(r"```console\n(.*?)```", page, flags=re.S)[:1]
    runs: list[tuple[str, list[str]]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            runs.append((line[2:], []))
        elif runs:
            runs[-1][1].append(line)
    return runs


def _shape(line: str) -> str:
    """A printed line with its numbers blanked: what the command prints, not what it measured."""
    return re.sub(r"-?\d+(\.\d+)?", "#", line)


@pytest.mark.slow
def test_the_cli_pages_demo_runs_as_written_on_the_folder_it_describes(tmp_path: Path) -> None:
    """docs/cli.md's demo in an empty folder made as the page says (tools/cli_demo.py): two resnet18 state
    dicts with a 10-way head, and the digits prepared into ``digits`` (here 300 of them, untrained
    weights: the commands and the shape of what they print are under test, not the barriers)."""
    from torchvision.models import resnet18

    from lmclab.core.data import prepare

    page = (ROOT / "docs/cli.md").read_text()
    assert 'prepare("mnist5k", "raw", "digits")' in page  # the folder the demo's --data names
    prepare("mnist5k", tmp_path / "raw", tmp_path / "digits", max_train=200, max_test=100)
    for seed, name in enumerate(("a.pt", "b.pt")):
        torch.manual_seed(seed)
        torch.save(resnet18(num_classes=10).state_dict(), tmp_path / name)
    runs = _console(page)
    assert [c.split()[1] for c, _ in runs] == ["match", "barrier", "barrier"]
    script = Path(sys.executable).parent / "lmclab"
    source = [p for p in sys.path if p.endswith("src")]
    env = {
        **os.environ,
        "PATH": f"{script.parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": os.pathsep.join(source),
    }
    for command, printed in runs:
        proc = subprocess.run(command, shell=True, cwd=tmp_path, capture_output=True, text=True, env=env)
        assert proc.returncode == 0, f"{command}\n{proc.stdout}\n{proc.stderr[-1500:]}"
        assert proc.stderr == "", proc.stderr  # no warning: the heads fit the data
        assert [_shape(x) for x in proc.stdout.strip().splitlines()] == [_shape(x) for x in printed], command
