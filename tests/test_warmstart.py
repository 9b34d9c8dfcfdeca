"""Warm start (lmclab.warmstart): a stage run in a fork of the preloaded server behaves exactly like
``python script`` — argv, cwd, environment, stdio, exit codes, tracebacks, signals — and gives the
same results as a fresh process."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = '''
import os, sys, time
from lmclab.warmstart import WORKER_ENV, run_script
if __name__ == "__main__":
    code = run_script(sys.argv[0], sys.argv[1:])
    if code is not None:
        sys.exit(code)
    import helper
    print("warm" if WORKER_ENV in os.environ else "cold", "torch" in sys.modules, "lmclab.spec" in sys.modules,
          os.getcwd(), os.environ.get("PROBE"), sys.argv[1:], helper.VALUE, flush=True)
    print("to stderr", file=sys.stderr)
    if sys.argv[1] == "raise":
        raise RuntimeError("boom")
    if sys.argv[1] == "sleep":
        open(sys.argv[2], "w").write(str(os.getpid()))
        time.sleep(60)
    sys.exit(int(sys.argv[1]))
'''


@pytest.fixture()
def warm_env(tmp_path: Path):  # noqa: ANN201
    """A private server directory (short path: Unix socket names are limited to ~100 bytes)."""
    where = Path(tempfile.mkdtemp(prefix="lw-"))
    (tmp_path / "script.py").write_text(SCRIPT)
    (tmp_path / "helper.py").write_text("VALUE = 1\n")
    env = {**os.environ, "LMCLAB_WARM_DIR": str(where), "LMCLAB_WARM_IDLE": "20", "PROBE": "p1"}
    yield env
    for lock in where.glob("*.lock"):
        pid = lock.read_text().strip()
        if pid:
            try:
                os.kill(int(pid), signal.SIGTERM)
            except ProcessLookupError:
                pass
    shutil.rmtree(where, ignore_errors=True)


def _run(tmp_path: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    cwd = tmp_path / "elsewhere"
    cwd.mkdir(exist_ok=True)
    return subprocess.run([sys.executable, str(tmp_path / "script.py"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_a_warm_stage_sees_the_callers_argv_cwd_env_stdio_and_returns_its_exit_code(tmp_path, warm_env) -> None:
    first = _run(tmp_path, warm_env, "3", "x y")
    assert first.returncode == 3, first.stderr
    assert first.stdout.split()[:4] == ["warm", "True", "False", str(tmp_path / "elsewhere")]
    assert "p1 ['3', 'x y'] 1" in first.stdout and first.stderr == "to stderr\n"
    (tmp_path / "helper.py").write_text("VALUE = 2\n")  # edited sources are never stale
    second = _run(tmp_path, {**warm_env, "PROBE": "p2"}, "0")
    assert second.returncode == 0 and "warm True False" in second.stdout and "p2 ['0'] 2" in second.stdout
    assert len(list(Path(warm_env["LMCLAB_WARM_DIR"]).glob("*.sock"))) == 1  # one server served both


def test_an_exception_exits_1_with_its_traceback_and_warm_start_can_be_turned_off(tmp_path, warm_env) -> None:
    failed = _run(tmp_path, warm_env, "raise")
    assert failed.returncode == 1 and "RuntimeError: boom" in failed.stderr and "Traceback" in failed.stderr
    cold = _run(tmp_path, {**warm_env, "LMCLAB_WARM": "0"}, "0")
    assert cold.returncode == 0 and cold.stdout.startswith("cold False False")


def _start_sleeper(tmp_path: Path, env: dict) -> tuple[subprocess.Popen, int]:
    pid_file = tmp_path / "worker.pid"
    client = subprocess.Popen([sys.executable, str(tmp_path / "script.py"), "sleep", str(pid_file)],
                              cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (pid_file.is_file() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    worker = int(pid_file.read_text())
    assert worker != client.pid  # the stage runs in the server's fork, not in the client
    return client, worker


def _gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_ctrl_c_reaches_the_worker_and_a_killed_client_takes_its_worker_along(tmp_path, warm_env) -> None:
    client, worker = _start_sleeper(tmp_path, warm_env)
    client.send_signal(signal.SIGINT)
    _, err = client.communicate(timeout=30)
    assert client.returncode == 130 and "KeyboardInterrupt" in err and _gone(worker, 10)
    client, worker = _start_sleeper(tmp_path, warm_env)
    client.kill()
    client.wait(timeout=10)
    assert _gone(worker, 10)


@pytest.mark.slow
def test_the_train_stage_gives_the_same_checkpoint_warm_and_cold(tmp_path, warm_env, prepared) -> None:  # noqa: ANN001
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["model"]["mlp"] = {"hidden": 2, "width": 24}
    params["train"].update(epochs=2, batch_size=100)
    params["device"] = "cpu"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    outputs = {}
    for mode in ("1", "0"):
        out = tmp_path / f"seed3-{mode}.pt"
        proc = subprocess.run([sys.executable, str(ROOT / "stages/train.py"), "--seed", "3", "--data", str(prepared),
                               "--out", str(out), "--history", str(tmp_path / f"h{mode}.parquet")],
                              cwd=tmp_path, env={**warm_env, "LMCLAB_WARM": mode}, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        outputs[mode] = torch.load(out, weights_only=False)["state_dict"]
        assert list(Path(warm_env["LMCLAB_WARM_DIR"]).glob("*.sock"))  # a server ran the warm one
    assert all(torch.equal(outputs["1"][k], outputs["0"][k]) for k in outputs["0"])
