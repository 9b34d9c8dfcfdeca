"""Training metrics through DVCLive (docs/live-training.md): the files of one seed's DVCLive directory
(``lmclab.pipeline.live``), fresh on every run, written by the main process only; and through real
`dvc`: a running experiment's step in `dvc exp show`, its curves in `dvc plots show`, a rerun after
the run was killed, and each seed's metrics in `dvc metrics show`."""

from __future__ import annotations

import copy
import csv
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from dvc_repo import TINY, deep_update, dvc_env, run

from lmclab.archs import make_config
from lmclab.pipeline.live import epoch_logger, live_name
from lmclab.train.training import train

CURVES = ("lr", "train/loss", "train/acc", "test/loss", "test/acc")  # plots/metrics/<name>.tsv


def _tsv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


def _trained(splits, directory: Path | None, epochs: int = 3, main: bool = True) -> list[dict]:
    config = make_config("mlp", input_shape=(1, 28, 28), num_classes=10, hidden=1, width=16)
    with epoch_logger(directory, main=main) as on_epoch:
        return train(
            "mlp", config, 0, splits["train"], splits["test"], epochs=epochs, batch_size=200, on_epoch=on_epoch
        )[1]


def test_history_keys_become_dvclive_names() -> None:
    assert [live_name(k) for k in ("train_loss", "test_acc", "lr", "train", "nc1")] == [
        "train/loss",
        "test/acc",
        "lr",
        "train",
        "nc1",
    ]


def test_each_epoch_is_a_step_of_the_seeds_dvclive_files(splits, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # no git, no DVC: DVCLive writes its files all the same
    history = _trained(splits, tmp_path / "live")
    last = history[-1]
    assert json.loads((tmp_path / "live/metrics.json").read_text()) == {
        "lr": last["lr"],
        "train": {"loss": last["train_loss"], "acc": last["train_acc"]},
        "test": {"loss": last["test_loss"], "acc": last["test_acc"]},
        "step": 3,  # step = epoch; no timestamp: the same training gives the same bytes (dvc.lock)
    }
    for name in CURVES:
        rows = _tsv(tmp_path / "live/plots/metrics" / f"{name}.tsv")
        column = name.replace("/", "_")
        assert [(int(r["step"]), float(r[name.split("/")[-1]])) for r in rows] == [
            (h["epoch"], h[column]) for h in history
        ], name
    assert sorted(p.name for p in (tmp_path / "live").iterdir()) == ["metrics.json", "plots"]  # no dvc.yaml


def test_a_rerun_after_an_interrupted_one_starts_the_files_afresh(splits, tmp_path, monkeypatch) -> None:
    """The killed run left 50 steps and a half-written metrics.json; training restarts at epoch 1, and so
    do the curves (resuming would append to the dead run's rows, or fail on its JSON)."""
    monkeypatch.chdir(tmp_path)
    stale = tmp_path / "live/plots/metrics/test"
    stale.mkdir(parents=True)
    (stale / "acc.tsv").write_text("step\tacc\n" + "".join(f"{s}\t0.5\n" for s in range(1, 51)))
    (tmp_path / "live/metrics.json").write_text('{"step": 50, "test": {"acc"')
    history = _trained(splits, tmp_path / "live", epochs=2)
    assert [float(r["acc"]) for r in _tsv(stale / "acc.tsv")] == [h["test_acc"] for h in history]
    assert json.loads((tmp_path / "live/metrics.json").read_text())["step"] == 2


def test_only_the_main_process_logs(splits, tmp_path) -> None:
    with epoch_logger(tmp_path / "live", main=False) as on_epoch:
        assert on_epoch is None
    with epoch_logger(None) as on_epoch:
        assert on_epoch is None
    assert not (tmp_path / "live").exists()


def test_a_git_repository_without_a_commit_still_gets_the_files(splits, tmp_path, monkeypatch) -> None:
    """`git init`, `dvc init`, `dvc repro`: DVCLive 3.49 alone fails there ("Empty git repo")."""
    run(tmp_path, "git", "init", "-q")
    run(tmp_path, "dvc", "init", "-q")
    monkeypatch.chdir(tmp_path)
    _trained(splits, tmp_path / "live", epochs=1)
    assert json.loads((tmp_path / "live/metrics.json").read_text())["step"] == 1


def _stage_pid(repo: Path) -> int | None:
    """The running train stage of ``repo`` (run cold: LMCLAB_WARM=0, so it is a process of its own)."""
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            cwd = os.readlink(entry / "cwd")
        except (OSError, ValueError):
            continue
        if cwd == str(repo) and cmdline.startswith("python stages/train.py"):
            return int(entry.name)
    return None


def _step_of(path: Path) -> int:
    try:
        return json.loads(path.read_text())["step"]
    except (OSError, ValueError, KeyError):  # not written yet, or being rewritten
        return 0


def _last_plotted_step(path: Path) -> int:
    try:
        rows = _tsv(path)
    except OSError:
        return 0
    return int(rows[-1]["step"]) if rows else 0


def _wait_until_stopped(pid: int) -> None:
    """SIGSTOP is delivered asynchronously: wait until every thread of ``pid`` is stopped ("T")."""
    for _ in range(200):
        try:
            states = {
                (t / "stat").read_text().rsplit(")", 1)[1].split()[0] for t in Path(f"/proc/{pid}/task").iterdir()
            }
        except OSError:
            return
        if states <= {"T", "t"}:
            return
        time.sleep(0.01)


def _wait_for_a_step(repo: Path, driver: subprocess.Popen) -> int:
    """Block until the running train stage has logged a step; SIGSTOP it between two steps and return its pid.

    DVCLive appends a step's rows to the curves before it rewrites ``metrics.json``: a stop that lands
    between the two is let go on and tried again, so the test sees one whole step."""
    live = repo / "dvclive/seed0"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and driver.poll() is None:
        pid = _stage_pid(repo)
        if pid and _step_of(live / "metrics.json") >= 1:
            os.kill(pid, signal.SIGSTOP)
            _wait_until_stopped(pid)
            if _last_plotted_step(live / "plots/metrics/test/acc.tsv") == _step_of(live / "metrics.json"):
                return pid
            os.kill(pid, signal.SIGCONT)
        time.sleep(0.05)
    raise AssertionError(f"train@0 never logged a step (dvc exit code {driver.poll()}): {driver.communicate()}")


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/cwd").exists(), reason="finds the stage process in /proc")
def test_dvc_shows_a_running_experiments_step_and_curves_and_reruns_after_a_kill(tmp_path, tiny_run) -> None:
    repo = tiny_run.restore(tmp_path)  # the tiny run: its data stays cached, training runs anew
    params = deep_update(copy.deepcopy(TINY), {"train": {"epochs": 2}})
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    run(repo, "git", "add", "-A")
    run(repo, "git", "commit", "-qm", "baseline")
    driver = subprocess.Popen(  # long enough to be caught running; stopped at its first logged step
        ["dvc", "exp", "run", "train@0", "-S", "train.epochs=5000"],
        cwd=repo,
        env={**dvc_env(), "LMCLAB_WARM": "0"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        _wait_for_a_step(repo, driver)
        step = _step_of(repo / "dvclive/seed0/metrics.json")
        rows = json.loads(run(repo, "dvc", "exp", "show", "--json", stdout_only=True))
        (running,) = [
            e for r in rows for e in r.get("experiments") or [] if (e.get("executor") or {}).get("state") == "running"
        ]
        metrics = running["revs"][0]["data"]["metrics"]["dvclive/seed0/metrics.json"]["data"]
        assert metrics["step"] == step and 0 <= metrics["test"]["acc"] <= 1
        plots = json.loads(run(repo, "dvc", "plots", "show", "--json", stdout_only=True))["data"]
        values = plots["dvclive/seed0/plots/metrics/test/acc.tsv"][0]["content"]["data"]["values"]
        assert [int(v["step"]) for v in values] == list(range(1, step + 1))
    finally:
        os.killpg(driver.pid, signal.SIGKILL)  # an interruption: dvc and its stage die mid-training
        driver.wait()
    run(repo, "git", "checkout", "HEAD", "--", "params.yaml")  # the baseline's 2 epochs (exp run staged its -S)
    run(repo, "dvc", "exp", "run", "train")  # the rerun completes, every seed's files from this run only
    shown = json.loads(run(repo, "dvc", "metrics", "show", "--json", stdout_only=True))
    (workspace,) = shown.values()
    plots = json.loads(run(repo, "dvc", "plots", "show", "--json", stdout_only=True))["data"]
    for seed in TINY["train"]["seeds"]:
        live = workspace["data"][f"dvclive/seed{seed}/metrics.json"]["data"]
        assert live["step"] == 2 and set(live) == {"lr", "train", "test", "step"}
        for name in CURVES:
            (entry,) = plots[f"dvclive/seed{seed}/plots/metrics/{name}.tsv"]
            assert [int(v["step"]) for v in entry["content"]["data"]["values"]] == [1, 2], (seed, name)
    assert run(repo, "dvc", "status", "train", stdout_only=True).strip().endswith("up to date.")
