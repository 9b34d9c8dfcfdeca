"""dvc.yaml's ``deps:`` cover every file of the repository a stage runs or reads, so a changed input
reruns what depends on it: the import closure of each stage script (static analysis, imports inside
functions included) and every path on its command line. The edit-and-rerun checks through real
``dvc status`` are in tests/test_pipeline.py."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from dvc_repo import ROOT

from lmclab.pipeline.closure import code_closure, covered, import_closure, minimal_cover, stage_script
from lmclab.pipeline.stage import load_yaml

STAGES = load_yaml(ROOT / "dvc.yaml")["stages"]


def _listed(stage: dict, key: str) -> list[str]:
    """The paths under ``deps``/``outs``/``metrics`` (entries may be ``{path: options}``)."""
    return [next(iter(e)) if isinstance(e, dict) else str(e) for e in stage.get(key) or []]


@pytest.mark.parametrize("name", sorted(STAGES))
def test_every_file_a_stage_imports_is_one_of_its_deps(name: str) -> None:
    script = stage_script(STAGES[name]["cmd"])
    assert script is not None, f"stage {name}: its cmd does not run a python script"
    deps = _listed(STAGES[name], "deps")
    missing = sorted(f for f in code_closure(ROOT, script) if not covered(f, deps))
    assert not missing, (
        f"stage {name} imports {', '.join(missing)}, which its deps: in dvc.yaml do not "
        "list (run `python tools/stage_deps.py --write`)"
    )


@pytest.mark.parametrize("name", sorted(STAGES))
def test_every_code_dep_exists_and_is_imported(name: str) -> None:
    """No stale entry: a listed code path exists and the stage imports something under it."""
    files = code_closure(ROOT, stage_script(STAGES[name]["cmd"]))
    for dep in _listed(STAGES[name], "deps"):
        if dep.startswith(("src/", "stages/")):
            assert (ROOT / dep).exists(), f"stage {name}: deps: lists {dep}, which does not exist"
            assert any(covered(f, [dep]) for f in files), f"stage {name}: deps: lists {dep}, which it never imports"


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
    assert minimal_cover(code_closure(tmp_path, "stages/run.py"), tmp_path, top="src/pkg") == [
        "src/pkg/__init__.py",
        "src/pkg/flat.py",
        "src/pkg/rel.py",
        "src/pkg/sub",
        "stages/helper.py",
        "stages/run.py",
    ]


def test_the_closure_of_train_reaches_the_loader_through_the_stage(tmp_path: Path) -> None:
    """The defects this test was written for: train imports load_split, every stage the plumbing."""
    files = code_closure(ROOT, "stages/train.py")
    assert {"src/lmclab/core/data.py", "src/lmclab/pipeline/stage.py", "stages/_repo_src.py"} <= files
    assert not any(f.startswith("src/lmclab/report/") for f in files)
    assert import_closure(ROOT / "stages/_repo_src.py", [ROOT / "src"]) == {(ROOT / "stages/_repo_src.py").resolve()}


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
