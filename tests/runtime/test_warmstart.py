"""Warm start (lmclab.runtime.warmstart): a stage run in a fork of the preloaded server behaves exactly like
``python script`` — argv, cwd, environment, stdio, exit codes, tracebacks, signals — and gives the
same results as a fresh process; it trusts only its own user (lmclab.runtime.trust: a private directory,
0600 socket and lock, SO_PEERCRED on both ends) and a worker dies with its client and its session; --help
and refused command lines start no server, and a stopped or idle server leaves no socket or lock behind."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import os, sys, time
from lmclab.runtime.warmstart import WORKER_ENV, run_script
if __name__ == "__main__":
    code = run_script(sys.argv[0], sys.argv[1:])
    if code is not None:
        sys.exit(code)
    import helper
    print("warm" if WORKER_ENV in os.environ else "cold", "torch" in sys.modules, "lmclab.core.spec" in sys.modules,
          os.getcwd(), os.environ.get("PROBE"), sys.argv[1:], helper.VALUE, flush=True)
    print("to stderr", file=sys.stderr)
    if sys.argv[1] == "raise":
        raise RuntimeError("boom")
    if sys.argv[1] == "sleep":
        open(sys.argv[2], "w").write(str(os.getpid()))
        time.sleep(60)
    sys.exit(int(sys.argv[1]))
"""


def _stop_servers(where: Path) -> None:
    for lock in where.glob("**/*.lock"):
        pid = lock.read_text().strip()
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGTERM)


@pytest.fixture()
def warm_env(tmp_path: Path):
    """A private server directory (short path: Unix socket names are limited to ~100 bytes)."""
    where = Path(tempfile.mkdtemp(prefix="lw-"))
    (tmp_path / "script.py").write_text(SCRIPT)
    (tmp_path / "helper.py").write_text("VALUE = 1\n")
    env = {**os.environ, "LMCLAB_WARM_DIR": str(where), "LMCLAB_WARM_IDLE": "20", "PROBE": "p1"}
    yield env
    _stop_servers(where)
    shutil.rmtree(where, ignore_errors=True)


def _run(tmp_path: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    cwd = tmp_path / "elsewhere"
    cwd.mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, str(tmp_path / "script.py"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


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
    pid_file.unlink(missing_ok=True)  # else a second sleeper would read the first one's pid
    client = subprocess.Popen(
        [sys.executable, str(tmp_path / "script.py"), "sleep", str(pid_file)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
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


def _servers_of(where: Path) -> list[int]:
    """The pids of processes whose command line names ``where`` (a server is started with its socket path)."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(where).encode() in cmdline.read_bytes():
                pids.append(int(cmdline.parent.name))
        except OSError:
            pass  # gone meanwhile
    return pids


@pytest.mark.parametrize(
    ("stage", "args", "code", "shown"),
    [
        ("permute", ["--help"], 0, "Usage: permute.py"),
        ("train", ["--help"], 0, "Usage: train.py"),
        ("permute", ["--bogus"], 2, "No such option: --bogus"),
        ("train", ["--seed", "abc"], 2, "Invalid value for '--seed'"),
        ("measure", [], 2, "Missing option"),
    ],
)
def test_help_or_a_refused_command_line_starts_no_server(tmp_path, warm_env, stage, args, code, shown) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "stages" / f"{stage}.py"), *args],
        cwd=tmp_path,
        env=warm_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == code and shown in proc.stdout + proc.stderr, proc.stderr
    where = Path(warm_env["LMCLAB_WARM_DIR"])
    assert list(where.iterdir()) == [] and _servers_of(where) == []  # no socket, no lock, no server process


@pytest.mark.parametrize(("args", "runs"), [(["--seed", "3"], True), (["--help"], False), (["--seed", "x"], False)])
def test_a_stage_runs_warm_only_on_a_command_line_it_accepts(args, runs) -> None:
    import typer

    from lmclab.pipeline.stage import accepts

    app = typer.Typer(add_completion=False)

    @app.command()
    def main(seed: int = typer.Option(...)) -> None:
        pass

    assert accepts(app, args) is runs


STAGE = """
import os, sys
sys.path.insert(0, {src!r})
import typer
from lmclab.pipeline.stage import run_warm
from lmclab.runtime.warmstart import WORKER_ENV
app = typer.Typer(add_completion=False)

@app.command()
def main(seed: int = typer.Option(...)) -> None:
    print("warm" if WORKER_ENV in os.environ else "cold", seed)

if __name__ == "__main__":
    run_warm(app)
"""


def test_a_command_line_the_stage_accepts_runs_warm(tmp_path, warm_env) -> None:
    (tmp_path / "stage.py").write_text(STAGE.format(src=str(ROOT / "src")))

    def run(*args):
        return subprocess.run(
            [sys.executable, str(tmp_path / "stage.py"), *args],
            cwd=tmp_path,
            env=warm_env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    assert run("--seed", "x").returncode == 2 and not list(Path(warm_env["LMCLAB_WARM_DIR"]).iterdir())
    accepted = run("--seed", "3")
    assert accepted.returncode == 0 and accepted.stdout == "warm 3\n", accepted.stderr
    assert len(list(Path(warm_env["LMCLAB_WARM_DIR"]).glob("*.sock"))) == 1


@pytest.mark.parametrize("stop", ["SIGTERM", "SIGHUP", "idle"])
def test_a_stopped_or_idle_server_removes_its_socket_and_lock(tmp_path, warm_env, stop) -> None:
    env = {**warm_env, "LMCLAB_WARM_IDLE": "1" if stop == "idle" else "60"}
    assert _run(tmp_path, env, "0").returncode == 0
    where = Path(warm_env["LMCLAB_WARM_DIR"])
    (lock,) = where.glob("*.lock")
    assert [p.suffix for p in sorted(where.iterdir())] == [".lock", ".sock"]
    server = int(lock.read_text())
    if stop != "idle":
        os.kill(server, getattr(signal, stop))
    assert _gone(server, 10)
    assert list(where.iterdir()) == []


@pytest.mark.slow
def test_the_train_stage_gives_the_same_checkpoint_warm_and_cold(tmp_path, warm_env, prepared) -> None:
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["model"]["mlp"] = {"hidden": 2, "width": 24}
    params["train"].update(epochs=2, batch_size=100)
    params["device"] = "cpu"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    outputs = {}
    for mode in ("1", "0"):
        out = tmp_path / f"seed3-{mode}.pt"
        proc = subprocess.run(
            [
                sys.executable,
                str(ROOT / "stages/train.py"),
                "--seed",
                "3",
                "--data",
                str(prepared),
                "--out",
                str(out),
                "--history",
                str(tmp_path / f"h{mode}.parquet"),
                "--live",
                str(tmp_path / f"live{mode}"),
            ],
            cwd=tmp_path,
            env={**warm_env, "LMCLAB_WARM": mode},
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stderr
        outputs[mode] = torch.load(out, weights_only=False)["state_dict"]
        if mode == "1":  # a server ran the warm one (checked now: it exits LMCLAB_WARM_IDLE s after its last stage)
            assert list(Path(warm_env["LMCLAB_WARM_DIR"]).glob("*.sock"))
    assert all(torch.equal(outputs["1"][k], outputs["0"][k]) for k in outputs["0"])
    assert (tmp_path / "live1/metrics.json").read_bytes() == (tmp_path / "live0/metrics.json").read_bytes()  # DVCLive's


# ---------------------------------------------------------------- trust: only this user's directory and peers

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: to chown to, or drop privileges to, uid 65534")


@pytest.fixture()
def default_env(warm_env: dict):
    """The default location: ``$TMPDIR/lmclab-warm-$UID`` in a fresh short ``TMPDIR``."""
    base = Path(tempfile.mkdtemp(prefix="lt-"))
    env = {k: v for k, v in warm_env.items() if k not in ("LMCLAB_WARM_DIR", "XDG_RUNTIME_DIR")}
    yield base, {**env, "TMPDIR": str(base)}
    _stop_servers(base)
    shutil.rmtree(base, ignore_errors=True)


def _make_untrusted(path: Path, kind: str) -> Path:
    """An existing directory at ``path`` that another user could control; returns what must stay empty."""
    if kind == "symlink":  # to a private directory of ours: only lstat tells
        target = path.with_name("target")
        target.mkdir(mode=0o700)
        path.symlink_to(target)
        return target
    path.mkdir()
    os.chmod(path, 0o777 if kind == "mode 0777" else 0o700)
    if kind == "owner":
        os.chown(path, NOBODY, NOBODY)
    return path


@pytest.mark.parametrize(
    ("where", "kind", "reason"),
    [
        ("default", "mode 0777", "has mode 0777, expected 0700"),
        ("default", "owner", f"is owned by uid {NOBODY}, not by this user (uid {os.getuid()})"),
        ("default", "symlink", "is a symlink"),
        ("LMCLAB_WARM_DIR", "mode 0777", "has mode 0777, expected 0700"),
        ("XDG_RUNTIME_DIR", "owner", f"is owned by uid {NOBODY}, not by this user (uid {os.getuid()})"),
    ],
)
def test_an_untrusted_directory_runs_the_stage_cold_after_one_line_naming_it(
    tmp_path, default_env, where, kind, reason
) -> None:
    if kind == "owner" and os.geteuid() != 0:
        pytest.skip("needs root to chown a directory to another uid")
    base, env = default_env
    path = {
        "default": base / f"lmclab-warm-{os.getuid()}",
        "LMCLAB_WARM_DIR": base / "override",
        "XDG_RUNTIME_DIR": base / "run",
    }[where]
    untouched = _make_untrusted(path, kind)
    if where != "default":
        env[where] = str(path)
    proc = _run(tmp_path, env, "3", "x y")
    assert proc.returncode == 3 and proc.stdout.startswith("cold False False") and "['3', 'x y'] 1" in proc.stdout
    assert proc.stderr.splitlines() == [f"lmclab: warm start refused, running cold: {path} {reason}", "to stderr"]
    assert list(untouched.iterdir()) == []  # no socket, no lock, no server


@pytest.mark.parametrize("mode", [0o770, 0o750, 0o711, 0o777, 0o700], ids=lambda mode: f"{mode:04o}")
def test_only_a_0700_directory_is_private(tmp_path, monkeypatch, mode) -> None:
    """Group access is refused too, not only world-writable modes (group members are other users)."""
    from lmclab.runtime.trust import warm_dir

    path = tmp_path / "warm"
    path.mkdir()
    os.chmod(path, mode)
    monkeypatch.setenv("LMCLAB_WARM_DIR", str(path))
    expected = None if mode == 0o700 else f"has mode {mode:04o}, expected 0700"
    assert warm_dir() == (path, expected)


@pytest.mark.parametrize("where", ["default", "XDG_RUNTIME_DIR"])
def test_a_new_directory_is_made_private_with_a_0600_socket_and_lock(tmp_path, default_env, where) -> None:
    base, env = default_env
    if where == "XDG_RUNTIME_DIR":
        (base / "run").mkdir(mode=0o700)
        env["XDG_RUNTIME_DIR"] = str(base / "run")
    proc = _run(tmp_path, env, "0")
    assert proc.returncode == 0 and proc.stdout.startswith("warm True") and proc.stderr == "to stderr\n"
    made = base / "run" / "lmclab-warm" if where == "XDG_RUNTIME_DIR" else base / f"lmclab-warm-{os.getuid()}"
    modes = {p.suffix: stat.S_IMODE(os.lstat(p).st_mode) for p in (made, *made.iterdir())}
    assert modes == {"": 0o700, ".sock": 0o600, ".lock": 0o600}


def _as_nobody(fn) -> int:
    """Fork; the child drops to uid 65534 and exits with ``fn()``. Returns the child's pid."""
    pid = os.fork()
    if pid == 0:
        code = 2
        try:
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            code = fn()
        finally:
            os._exit(code)
    return pid


@needs_root
def test_the_server_drops_a_client_of_another_uid_before_running_anything(tmp_path, warm_env) -> None:
    assert _run(tmp_path, warm_env, "0").returncode == 0  # a server is up
    where = Path(warm_env["LMCLAB_WARM_DIR"])
    (sock,) = where.glob("*.sock")
    os.chmod(where, 0o711)  # let another user reach the socket: only SO_PEERCRED stands in the way
    os.chmod(sock, 0o666)
    marker = tmp_path / "ran"
    (tmp_path / "payload.py").write_text(f"open({str(marker)!r}, 'w').write('ran as the server')\n")
    request = {"script": str(tmp_path / "payload.py"), "argv": [], "cwd": "/", "env": {}, "umask": 0o22}

    def connect() -> int:  # sends its request at once, without waiting for the greeting
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(20)
        conn.connect(str(sock))
        try:
            socket.send_fds(conn, [json.dumps(request).encode() + b"\n"], [0, 1, 2])
            reply = conn.recv(100)
        except OSError:
            reply = b""
        return 0 if reply == b"" else 1

    pid = _as_nobody(connect)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0  # closed without a greeting
    time.sleep(1)
    assert not marker.exists()


@needs_root
def test_a_client_refuses_a_server_of_another_uid_and_runs_cold(tmp_path, warm_env) -> None:
    name = subprocess.run(
        [sys.executable, "-c", "from lmclab.runtime.warmstart import socket_name; print(socket_name())"],
        env=warm_env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    path = Path(warm_env["LMCLAB_WARM_DIR"]) / name
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))  # bound here, listening (SO_PEERCRED's identity) as another uid
    read_end, write_end = os.pipe()

    def impostor() -> int:
        listener.listen(1)
        listener.settimeout(60)
        os.write(write_end, b"L")
        data = b""
        try:
            conn, _ = listener.accept()
            conn.sendall(b"lmclab-warm 1\n")
            conn.settimeout(10)
            if data := conn.recv(1 << 16):  # the client's environment and stdio
                conn.sendall(b'{"pid": 1}\n{"exit": 0}\n')  # a forged success
        except OSError:
            pass
        os.write(write_end, b"got a request" if data else b"got nothing")
        return 0

    pid = _as_nobody(impostor)
    os.close(write_end)
    listener.close()
    assert os.read(read_end, 1) == b"L"
    proc = _run(tmp_path, warm_env, "3")
    os.waitpid(pid, 0)
    assert os.read(read_end, 100) == b"got nothing"
    assert proc.returncode == 3 and proc.stdout.startswith("cold False False")
    assert proc.stderr.splitlines() == [
        f"lmclab: warm start refused, running cold: {path}: its server runs as uid {NOBODY}, not as this user (uid 0)",
        "to stderr",
    ]


def test_a_worker_dies_with_its_session(tmp_path, warm_env) -> None:
    client, worker = _start_sleeper(tmp_path, warm_env)
    session = int(Path(f"/proc/{worker}/stat").read_text().rsplit(")", 1)[1].split()[1])
    os.kill(session, signal.SIGKILL)
    try:
        assert _gone(worker, 5)
    finally:
        _kill_quietly(worker)
        client.kill()
        client.wait(timeout=10)


def _kill_quietly(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def test_an_interpreter_found_through_a_relative_path_entry_runs_warm(tmp_path, warm_env) -> None:
    """``.venv/bin/dvc repro`` runs its stages' ``python`` through the relative PATH entry ``.venv/bin``, so
    ``sys.executable`` is relative; the server (started in /) must still start, and the stage run warm."""
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    (cwd / "env").symlink_to(sys.prefix)  # this environment, reached from cwd as env/bin (as .venv/bin)
    env = {**warm_env, "PATH": "env/bin" + os.pathsep + warm_env["PATH"]}
    name = Path(sys.executable).name
    run = subprocess.run(
        [name, str(tmp_path / "script.py"), "0"], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split()[0] == "warm"
