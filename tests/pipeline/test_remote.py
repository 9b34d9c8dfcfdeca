"""Sharing results between machines through a DVC remote: a run pushed to a local-directory
remote is restored in a fresh clone by ``dvc repro --pull`` without running a stage, and an experiment
travels with ``dvc exp push`` / ``dvc exp pull`` (its outputs through the remote, its refs through git)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dvc_repo import run

pytestmark = pytest.mark.slow


def clone(origin: Path, to: Path, remote: Path) -> Path:
    run(to.parent, "git", "clone", "-q", "-b", "main", str(origin), str(to))
    run(to, "git", "config", "user.email", "test@example.com")
    run(to, "git", "config", "user.name", "test")
    run(to, "dvc", "remote", "add", "--local", "-f", "-d", "store", str(remote))  # each machine's own path
    return to


def test_a_pushed_run_is_restored_in_a_fresh_clone_without_recomputing(tmp_path: Path, tiny_run):
    remote, origin = tmp_path / "remote", tmp_path / "origin.git"
    remote.mkdir(mode=0o700)
    first = tiny_run.restore(tmp_path / "first")  # the session's tiny run, reproduced and committed
    run(first, "dvc", "remote", "add", "--local", "-d", "store", str(remote))
    run(first, "dvc", "push")
    run(tmp_path, "git", "init", "-q", "--bare", str(origin))
    run(first, "git", "remote", "add", "origin", str(origin))
    run(first, "git", "push", "-q", "origin", "HEAD:main")

    second = clone(origin, tmp_path / "second", remote)
    out = run(second, "dvc", "repro", "--pull")
    assert "Running stage" not in out  # every stage restored from the remote, none recomputed
    model = (first / "data" / "models" / "seed0.pt").read_bytes()
    assert (second / "data" / "models" / "seed0.pt").read_bytes() == model
    assert "Data and pipelines are up to date" in run(second, "dvc", "status")

    run(first, "dvc", "exp", "run", "-n", "longer", "-S", "train.epochs=2")
    run(first, "dvc", "exp", "push", "origin", "longer")  # refs to git, outputs to the DVC remote
    run(second, "dvc", "exp", "pull", "origin", "longer")
    shown = json.loads(run(second, "dvc", "exp", "show", "--json", stdout_only=True))
    names = {exp.get("name") for row in shown for exp in (row.get("experiments") or [])}
    assert "longer" in names
    run(second, "dvc", "exp", "apply", "longer")
    out = run(second, "dvc", "repro")
    assert "Running stage" not in out  # the experiment's outputs came with it
    assert (second / "data" / "models" / "seed0.pt").read_bytes() != model  # trained for 2 epochs, not 1
