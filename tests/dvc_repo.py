"""A temporary git + DVC repository holding a copy of this checkout's pipeline (dvc.yaml, stages/,
src/, tools/, the plot templates and the metric gate's tolerances) with a tiny params.yaml, and
commands run in it with this venv's ``dvc`` and ``python``.
Shared by the tests that drive the real pipeline."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from lmclab.pipeline.stage import load_yaml

ROOT = Path(__file__).resolve().parent.parent
OVERRIDES = {  # a tiny run of the repository's own params.yaml
    "device": "cpu",
    "data": {"name": "mnist5k", "max_train": 300, "max_test": 100},
    "model": {"arch": "mlp", "mlp": {"hidden": 1, "width": 16}},
    "train": {"seeds": [0, 1, 2], "epochs": 1, "batch_size": 100},
    "permute": {"pairs": [[0, 1]], "methods": ["identity", "wm", "am"]},
    "measure": {"num_lambdas": 5},
    "three": {"triples": [[0, 1, 2]], "methods": ["identity", "wm"], "resolution": 3, "margin": 0.1},
    "merge_many": {"seeds": [0, 1, 2], "merge_many": {"max_iter": 3}, "c2m3": {"max_iter": 10}, "repair_samples": 100},
    "plot": {"dpi": 40, "title": "tiny"},
}


def deep_update(base: dict, changes: dict) -> dict:
    for key, value in changes.items():
        base[key] = deep_update(dict(base.get(key) or {}), value) if isinstance(value, dict) else value
    return base


TINY = deep_update(load_yaml(ROOT / "params.yaml"), OVERRIDES)


def dvc_env() -> dict[str, str]:
    """This interpreter's bin directory first, so `dvc` and the stages' `python` are the venv's."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


def run(repo: Path, *args: str, stdout_only: bool = False) -> str:
    proc = subprocess.run(args, cwd=repo, env=dvc_env(), capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout if stdout_only else proc.stdout + proc.stderr


COMMITTED_INPUTS = (  # files of the repository that stages read besides code and params
    "metrics/tolerances.yaml",
    "reports/three_study/table.parquet",  # summarize's note on the three-model finding
)


def copy_committed_inputs(repo: Path) -> None:
    for name in COMMITTED_INPUTS:
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, repo / name)


def make_repo(repo: Path, params: dict = TINY) -> Path:
    """``repo`` (an empty directory) as a git + DVC repository of the pipeline with ``params``."""
    for item in ("dvc.yaml", ".dvcignore", ".gitignore"):
        shutil.copy(ROOT / item, repo / item)
    for folder in ("stages", "src", "tools"):
        shutil.copytree(ROOT / folder, repo / folder, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    copy_committed_inputs(repo)
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    run(repo, "git", "init", "-q")
    run(repo, "git", "config", "user.email", "test@example.com")
    run(repo, "git", "config", "user.name", "test")
    run(repo, "dvc", "init", "-q")
    run(repo, "dvc", "config", "core.analytics", "false")
    shutil.copytree(ROOT / ".dvc" / "plots", repo / ".dvc" / "plots")
    if (ROOT / ".dvc" / "offline_plots.html").is_file():  # built by `make setup`
        shutil.copy(ROOT / ".dvc" / "offline_plots.html", repo / ".dvc" / "offline_plots.html")
        run(repo, "dvc", "config", "plots.html_template", "offline_plots.html")
    return repo
