"""No stage outlives the `dvc` that started it: `kill -9` of `dvc repro` while `measure` runs leaves
no stage process, session or worker behind (nothing writes outputs after dvc died), and a rerun
completes with `dvc status` clean."""

from __future__ import annotations

import contextlib
import copy
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from dvc_repo import TINY, deep_update, dvc_env, run

pytestmark = [
    pytest.mark.slow,  # the tiny run restored: measure and the stages after it, twice
    pytest.mark.skipif(not Path("/proc/self/cwd").exists(), reason="reads processes from /proc"),
]


def _processes_of(repo: Path, exclude: set[int]) -> dict[int, str]:
    """pid -> command line of every live process working in ``repo`` or naming it on its command line."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in exclude | {os.getpid()}:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(entry / "cwd")  # fails for zombies: they run nothing
        except OSError:
            continue
        if cwd == str(repo) or cwd.startswith(f"{repo}/") or str(repo) in cmdline:
            found[int(entry.name)] = cmdline
    return found


def _servers(warm_dir: Path) -> set[int]:
    """The warm-start servers (shared by every run; each exits after LMCLAB_WARM_IDLE idle seconds)."""
    return {int(text) for lock in warm_dir.glob("*.lock") if (text := lock.read_text().strip())}


def _wait_for_measure(repo: Path, warm_dir: Path, driver: subprocess.Popen) -> dict[int, str]:
    """Block until the measure stage's client and its warm worker both run; return the run's processes."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and driver.poll() is None:
        procs = _processes_of(repo, _servers(warm_dir) | {driver.pid})
        client = any("stages/measure.py" in cmd for cmd in procs.values())
        worker = any("warmstart import serve" in cmd for cmd in procs.values())  # a fork of the server
        if client and worker:
            return procs
        time.sleep(0.02)
    raise AssertionError(f"measure never ran (dvc exit code {driver.poll()}): {driver.communicate()}")


def test_killing_dvc_mid_measure_leaves_no_process_and_a_rerun_completes(tmp_path_factory, tiny_run) -> None:
    repo = tiny_run.restore(tmp_path_factory.mktemp("interrupted"))  # the tiny run: only measure on reruns
    params = deep_update(copy.deepcopy(TINY), {"measure": {"num_lambdas": 41}})  # a measure of a few seconds
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    warm_dir = Path(tempfile.mkdtemp(prefix="lk-"))
    env = {**dvc_env(), "LMCLAB_WARM": "1", "LMCLAB_WARM_DIR": str(warm_dir), "LMCLAB_WARM_IDLE": "30"}
    try:
        driver = subprocess.Popen(
            ["dvc", "repro"], cwd=repo, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        running = _wait_for_measure(repo, warm_dir, driver)
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        deadline, left = time.monotonic() + 5, running
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = _processes_of(repo, _servers(warm_dir))
        assert left == {}, f"still running 5 s after dvc was killed: {left}"

        rerun = subprocess.run(["dvc", "repro"], cwd=repo, env=env, capture_output=True, text=True)
        assert rerun.returncode == 0, rerun.stdout + rerun.stderr
        assert "Running stage 'measure@pair0'" in rerun.stdout
        status = run(repo, "dvc", "status")
        assert "Data and pipelines are up to date." in status, status
    finally:
        for pid in _servers(warm_dir):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        shutil.rmtree(warm_dir, ignore_errors=True)
