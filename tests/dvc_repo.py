"""A temporary git + DVC repository holding a copy of this checkout's pipeline (dvc.yaml, stages/,
src/, tools/, the plot templates and the metric gate's tolerances) with a tiny params.yaml, and
commands run in it with this venv's ``dvc`` and ``python``.
Shared by the tests that drive the real pipeline.

The tiny pipeline is reproduced once per test session (:func:`tiny_run`, the ``tiny_run`` fixture of
``tests/conftest.py``); a test that needs a finished run starts from a copy of it
(:meth:`TinyRun.restore`): its workspace, git history, ``dvc.lock`` and DVC cache with the run-cache, so a
``dvc repro`` there runs only what the test changed, as it would in a user's repository after a run."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
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


@dataclass(frozen=True)
class TinyRun:
    """The tiny pipeline reproduced and committed once: never changed by a test, which restores a copy."""

    repo: Path
    output: str  # what its first `dvc repro` printed (every stage ran)

    def restore(self, to: Path) -> Path:
        """A copy of the finished run at ``to`` (an empty or missing directory): workspace, git, the DVC
        cache (hard links: DVC never rewrites a cache file, it writes a new one) and the run-cache."""
        to.mkdir(parents=True, exist_ok=True)
        cache = self.repo / ".dvc" / "cache"
        shutil.copytree(self.repo, to, symlinks=True, dirs_exist_ok=True, ignore=_ignore_cache(cache))
        shutil.copytree(cache, to / ".dvc" / "cache", symlinks=True, copy_function=os.link)
        return to


def _ignore_cache(cache: Path):
    return lambda folder, names: ["cache"] if Path(folder) == cache.parent else []


def tiny_run(root: Path, params: dict = TINY) -> TinyRun:
    """The tiny pipeline reproduced under ``root`` once: the first caller runs ``dvc repro`` and commits
    the result; callers waiting on the lock (other xdist workers, which share ``root``) reuse it. A run
    that failed half-way is started again from scratch."""
    repo, done, printed = root / "tiny-run", root / "tiny-run.done", root / "tiny-run.out"
    with open(root / "tiny-run.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            with contextlib.suppress(FileNotFoundError):
                shutil.rmtree(repo)
            repo.mkdir(parents=True)
            make_repo(repo, params)
            out = run(repo, "dvc", "repro")
            run(repo, "git", "add", "-A")
            run(repo, "git", "commit", "-qm", "the tiny run")
            printed.write_text(out)
            done.touch()
    return TinyRun(repo, printed.read_text())
