"""dvc.yaml's ``deps:`` cover every file of the repository a stage runs or reads, so a changed input
reruns what depends on it: the import closure of each stage script (static analysis, imports inside
functions included), through the stage's code file (``data/code/<stage>.txt``, written by the code
stage), and every path on its command line. The edit-and-rerun checks through real ``dvc repro`` /
``dvc status`` are in tests/pipeline/test_pipeline.py."""

from __future__ import annotations

import hashlib
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from dvc_repo import ROOT

from lmclab.pipeline.closure import (
    CODE_STAGE,
    code_closure,
    code_file,
    code_fingerprint,
    import_closure,
    stage_script,
)
from lmclab.pipeline.stage import load_yaml

STAGES = load_yaml(ROOT / "dvc.yaml")["stages"]


def covered(path: str, listed) -> bool:
    """``path`` is one of ``listed`` or inside a listed directory."""
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in listed)


def _listed(stage: dict, key: str) -> list[str]:
    """The paths under ``deps``/``outs``/``metrics`` (entries may be ``{path: options}``)."""
    return [next(iter(e)) if isinstance(e, dict) else str(e) for e in stage.get(key) or []]


NON_CODE = sorted(n for n in STAGES if n != CODE_STAGE)


def _stem(name: str) -> str:
    return Path(stage_script(STAGES[name]["cmd"])).stem


@pytest.mark.parametrize("name", NON_CODE)
def test_a_stage_depends_on_its_code_file_and_on_no_source_path(name: str) -> None:
    deps = _listed(STAGES[name], "deps")
    assert code_file(_stem(name)) in deps, f"stage {name}: deps: lacks {code_file(_stem(name))}"
    sources = [d for d in deps if d.startswith(("src/", "stages/"))]
    assert not sources, f"stage {name}: deps: lists {sources}; its code file stands for them"


def test_the_code_stage_writes_every_code_file_and_depends_on_every_file_they_list() -> None:
    code = STAGES[CODE_STAGE]
    assert set(_listed(code, "outs")) == {code_file(_stem(n)) for n in NON_CODE}
    in_order = dict.fromkeys(_stem(n) for n in STAGES if n != CODE_STAGE)  # dvc.yaml's order
    assert f"--stages {','.join(in_order)}" in " ".join(code["cmd"].split())
    deps = _listed(code, "deps")
    for name in STAGES:
        missing = sorted(f for f in code_closure(ROOT, stage_script(STAGES[name]["cmd"])) if not covered(f, deps))
        assert not missing, f"stage {name} imports {missing}, which the code stage's deps do not cover"


def test_the_code_stage_writes_each_scripts_closure_and_refuses_an_unknown_stage(tmp_path: Path) -> None:
    run = [sys.executable, str(ROOT / "stages" / "code.py"), "--out", str(tmp_path)]
    subprocess.run([*run, "--stages", "train,plot"], check=True)
    for stem in ("train", "plot"):
        assert (tmp_path / f"{stem}.txt").read_text() == code_fingerprint(ROOT, f"stages/{stem}.py")
    bad = subprocess.run([*run, "--stages", "train,nope"], capture_output=True, text=True)
    assert bad.returncode == 1
    assert bad.stderr.strip() == "error: --stages: expected names of scripts in stages/, got ['nope']"


def _command_paths(cmd: str) -> list[str]:
    """The values of a command's ``--option value`` pairs that name files or folders."""
    words = shlex.split(cmd)
    return [
        value
        for flag, value in zip(words, words[1:], strict=False)
        if flag.startswith("--") and "/" in value and not value.startswith("-")
    ]


@pytest.mark.parametrize("name", sorted(STAGES))
def test_every_path_on_a_stage_command_line_is_a_dep_or_an_output(name: str) -> None:
    """A path the stage reads is in ``deps`` (itself, a folder holding it, or the files it reads
    inside it); a path it writes is in ``outs``/``metrics``/``plots`` (or holds them: a DVCLive directory)."""
    stage = STAGES[name]
    listed = _listed(stage, "deps") + _listed(stage, "outs") + _listed(stage, "metrics") + _listed(stage, "plots")
    for path in _command_paths(stage["cmd"]):
        inside = [d for d in listed if covered(d, [path])]
        assert covered(path, listed) or inside, f"stage {name}: {path} is on its command line but not in deps/outs"


def test_the_command_line_paths_are_read() -> None:
    assert _command_paths("python s.py --seed 1 --data data/prepared --out data/x/${item.a}.pt") == [
        "data/prepared",
        "data/x/${item.a}.pt",
    ]


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_the_closure_follows_every_kind_of_import(tmp_path: Path) -> None:
    """Imports inside functions, ``from package import submodule``, relative imports and the
    ``__init__.py`` of every package on the way; a module nobody imports stays out."""
    _write(
        tmp_path,
        {
            "stages/run.py": "import helper\ndef main():\n    from pkg.sub import deep\n",
            "stages/helper.py": "from pkg import flat\n",
            "src/pkg/__init__.py": "",
            "src/pkg/flat.py": "from . import rel\n",
            "src/pkg/rel.py": "",
            "src/pkg/sub/__init__.py": "",
            "src/pkg/sub/deep.py": "import pkg.sub.deeper as d\n",
            "src/pkg/sub/deeper.py": "",
            "src/pkg/unused.py": "",
        },
    )
    assert code_closure(tmp_path, "stages/run.py") == {
        "stages/run.py",
        "stages/helper.py",
        "src/pkg/__init__.py",
        "src/pkg/flat.py",
        "src/pkg/rel.py",
        "src/pkg/sub/__init__.py",
        "src/pkg/sub/deep.py",
        "src/pkg/sub/deeper.py",
    }


def test_a_code_file_lists_the_closure_with_md5s_and_changes_only_with_that_code(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "stages/run.py": "from pkg import flat\n",
            "stages/other.py": "import pkg.unused\n",
            "src/pkg/__init__.py": "",
            "src/pkg/flat.py": "x = 1\n",
            "src/pkg/unused.py": "",
        },
    )
    run, other = (code_fingerprint(tmp_path, f"stages/{s}.py") for s in ("run", "other"))
    assert run == "".join(
        f"{hashlib.md5((tmp_path / f).read_bytes()).hexdigest()}  {f}\n"
        for f in ("src/pkg/__init__.py", "src/pkg/flat.py", "stages/run.py")
    )
    (tmp_path / "src/pkg/flat.py").write_text("x = 2\n")  # only the stage that imports it sees the edit
    assert code_fingerprint(tmp_path, "stages/run.py") != run
    assert code_fingerprint(tmp_path, "stages/other.py") == other


def test_the_closure_of_train_reaches_the_loader_through_the_stage(tmp_path: Path) -> None:
    """The defects this test was written for: train imports load_split, every stage the plumbing."""
    files = code_closure(ROOT, "stages/train.py")
    assert {"src/lmclab/core/data.py", "src/lmclab/pipeline/stage.py", "stages/_repo_src.py"} <= files
    assert not any(f.startswith("src/lmclab/report/") for f in files)
    first = {
        "stages/_repo_src.py",
        "src/lmclab/__init__.py",
        "src/lmclab/core/__init__.py",
        "src/lmclab/core/threads.py",
    }
    assert import_closure(ROOT / "stages/_repo_src.py", [ROOT / "src"]) == {(ROOT / f).resolve() for f in first}
    assert first <= files  # the thread policy, set before torch loads, is every stage's dependency


def test_the_command_line_check_refuses_an_unlisted_input() -> None:
    stage = {"cmd": "python stages/x.py --data data/prepared --out data/y", "deps": ["stages/x.py"], "outs": ["data/y"]}
    listed = _listed(stage, "deps") + _listed(stage, "outs")
    assert [p for p in _command_paths(stage["cmd"]) if not covered(p, listed)] == ["data/prepared"]
    assert re.fullmatch(r"data/\w+", "data/prepared")


@pytest.mark.parametrize("name", sorted(STAGES))
def test_a_stage_puts_its_repository_first_before_importing_lmclab(name: str) -> None:
    """``stages/_repo_src.py`` must run before any lmclab import, or the stage may run other code than
    its deps name (an installed lmclab of another checkout)."""
    lines = (ROOT / stage_script(STAGES[name]["cmd"])).read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if re.match(r"(from|import) lmclab\b", line))
    assert any(re.match(r"from _repo_src import|import _repo_src", line) for line in lines[:first]), name
