"""The warm-start server in the test's own process (the other tests start it as a program, where neither
coverage nor mutation testing follows it): ``serve`` takes the lock and binds the socket, forks a session
per request that forks the worker, and on going idle removes both; the worker becomes the client's process
(cwd, environment, umask, stdio, argv, the script's folder first on ``sys.path``) and reports the script's
exit code the way ``python script`` would, and a client that hangs up takes its worker along. The pieces
are also tested on their own: ``run_main``'s exit codes, ``wait_exit``'s (:mod:`lmclab.runtime.warmworker`),
the lock and its pid."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from test_lifetime import _alive  # running, a zombie counting as gone

from lmclab.runtime import warmstart, warmworker

pytestmark = pytest.mark.skipif(not warmstart.enabled(), reason="warm start needs fork, SCM_RIGHTS and SO_PEERCRED")

SCRIPT = """
import os, sys, time
import helper
mask = os.umask(0)
print(os.getcwd(), os.environ.get("PROBE"), os.environ.get("LMCLAB_WARM_WORKER"), "HOME" in os.environ,
      oct(mask), sys.argv[1:], helper.VALUE, "lmclab.runtime.warmstart" in sys.modules, sys.stdin.read().strip(),
      flush=True)
print("to stderr", file=sys.stderr, flush=True)
if sys.argv[1] == "sleep":
    time.sleep(60)
if sys.argv[1] == "term":
    os.kill(os.getpid(), 15)
if sys.argv[1] == "close":  # as under python: closing sys.stderr leaves descriptor 2 open
    sys.stderr.close()
    os.write(2, b"descriptor 2 still open\\n")
    sys.exit(0)
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture()
def restored_signals():
    """``serve`` installs handlers for SIGTERM, SIGHUP and SIGCHLD in this process: put them back."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGINT)}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def _children() -> list[int]:
    """This process's child processes (from /proc: sessions the server forked here)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == os.getpid() and fields[0] != "Z":
                out.append(int(stat.parent.name))
    return out


@pytest.fixture()
def server_dir():
    where = Path(tempfile.mkdtemp(prefix="lw-"))  # 0700, and short: socket names are limited to ~100 bytes
    yield where
    shutil.rmtree(where, ignore_errors=True)
    for pid in _children():  # a session that never ended (a bug under test) must not outlive the test
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _read_all(fd: int) -> str:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks).decode()


class Client:
    """One request the way ``run_script`` sends it, with pipes for the worker's stdin, stdout and stderr."""

    def __init__(
        self, path: Path, script: Path, argv: list[str], cwd: Path, split: bool | str = False, fds: bool = True
    ):
        self.path, self.script, self.argv, self.cwd, self.split, self.fds = path, script, argv, cwd, split, fds
        self.hello = self.started = self.exit = None
        self.timed_out = False
        self.out = self.err = ""

    def __call__(self, hang_up: bool = False) -> None:
        conn = warmstart._connect(self.path, retries=400)
        assert conn is not None, "the server never listened"
        with conn:
            self.hello = conn.recv(len(warmstart._HELLO), socket.MSG_WAITALL)
            env = {"PROBE": "p2"} | {k: v for k, v in os.environ.items() if k == "MUTANT_UNDER_TEST"}
            request = {"script": str(self.script), "argv": self.argv, "cwd": str(self.cwd), "env": env, "umask": 0o027}
            message = json.dumps(request).encode() + b"\n"
            (in_r, in_w), (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe(), os.pipe()
            os.write(in_w, b"from stdin\n")
            os.close(in_w)
            first, rest = (message[:10], message[10:]) if self.split else (message, b"")
            socket.send_fds(conn, [first], [in_r, out_w, err_w] if self.fds else [])
            if rest:
                time.sleep(0.2)  # the session has read the first part by now
                if self.split == "hang up":
                    conn.shutdown(socket.SHUT_WR)  # the rest never comes
                else:
                    conn.sendall(rest)
            conn.settimeout(10)
            for fd in (in_r, out_w, err_w):
                os.close(fd)
            reader = conn.makefile("rb")
            try:
                self.started = json.loads(reader.readline() or b"null")
            except TimeoutError:  # the session neither answered nor hung up
                self.timed_out = True
                return
            if hang_up:
                reader.close()
                return
            self.exit = json.loads(reader.readline() or b"null")
            self.out, self.err = _read_all(out_r), _read_all(err_r)


def _serve(path: Path, *clients) -> None:
    """Run the server here until it has been idle for a second, with ``clients`` in threads."""
    threads = [threading.Thread(target=c) for c in clients]
    for t in threads:
        t.start()
    warmstart.serve(str(path))
    for t in threads:
        t.join(timeout=30)


@pytest.fixture()
def warm_script(tmp_path: Path) -> Path:
    (tmp_path / "script.py").write_text(SCRIPT)
    (tmp_path / "helper.py").write_text("VALUE = 7\n")
    (tmp_path / "elsewhere").mkdir()
    return tmp_path / "script.py"


def test_the_server_runs_requests_as_the_client_and_leaves_no_socket_or_lock(
    server_dir, warm_script, monkeypatch, restored_signals
) -> None:
    monkeypatch.setenv("LMCLAB_WARM_IDLE", "1")
    path, cwd = server_dir / "s.sock", warm_script.parent / "elsewhere"
    exits, split = Client(path, warm_script, ["3"], cwd), Client(path, warm_script, ["0"], cwd, split=True)
    raising = Client(path, warm_script, ["not a number"], cwd)
    killed = Client(path, warm_script, ["term"], cwd)
    closes = Client(path, warm_script, ["close"], cwd)
    _serve(path, exits, split, raising, killed, closes)
    assert sorted(p.name for p in server_dir.iterdir()) == []  # socket and lock removed
    assert exits.hello == warmstart._HELLO and exits.exit == {"exit": 3}, exits.err
    pid = exits.started["pid"]
    assert isinstance(pid, int) and pid != os.getpid()
    line = f"{cwd} p2 1 False 0o27 ['3'] 7 False from stdin\n"  # no lmclab module is carried into the script
    assert (exits.out, exits.err) == (line, "to stderr\n")
    assert split.exit == {"exit": 0} and split.out == line.replace("['3']", "['0']")
    assert raising.exit == {"exit": 1}
    assert raising.err.startswith("to stderr\nTraceback") and "ValueError" in raising.err
    assert killed.exit == {"exit": 128 + signal.SIGTERM}
    assert closes.exit == {"exit": 0} and closes.err == "to stderr\ndescriptor 2 still open\n"


def test_a_request_without_its_three_descriptors_runs_nothing(
    server_dir, warm_script, monkeypatch, restored_signals
) -> None:
    monkeypatch.setenv("LMCLAB_WARM_IDLE", "1")
    path = server_dir / "s.sock"
    client = Client(path, warm_script, ["0"], warm_script.parent, fds=False)
    cut = Client(path, warm_script, ["0"], warm_script.parent, split="hang up")  # half a request, then EOF
    _serve(path, client, cut)
    assert client.hello == warmstart._HELLO and client.started is None and client.exit is None
    assert cut.hello == warmstart._HELLO and (cut.started, cut.exit, cut.timed_out) == (None, None, False)


def test_a_server_whose_lock_file_was_removed_still_stops_cleanly(server_dir, monkeypatch, restored_signals) -> None:
    """``rm <dir>/*.lock`` while a server runs: it still removes its socket and returns when idle."""
    monkeypatch.setenv("LMCLAB_WARM_IDLE", "1")
    path = server_dir / "s.sock"

    def remove_lock() -> None:
        assert warmstart._connect(path, retries=400) is not None  # listening: the lock is taken
        path.with_suffix(".lock").unlink()

    _serve(path, remove_lock)
    assert list(server_dir.iterdir()) == []


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_a_client_that_hangs_up_takes_its_worker_along(server_dir, warm_script, monkeypatch, restored_signals) -> None:
    """The client is another process here: a session forked from this one would hold its end of the socket."""
    monkeypatch.setenv("LMCLAB_WARM_IDLE", "2")
    path = server_dir / "s.sock"
    read, write = os.pipe()

    def hang_up() -> int:
        client = Client(path, warm_script, ["sleep"], warm_script.parent)
        client(hang_up=True)  # returns once the worker runs, closing its socket
        os.write(write, f"{client.started['pid']}\n".encode())
        return 0

    client = _child(hang_up)
    warmstart.serve(str(path))
    with contextlib.suppress(ChildProcessError):  # reaped already: the server ignores SIGCHLD
        os.waitpid(client, 0)
    os.close(write)
    worker = int(_read_all(read))
    deadline = time.monotonic() + 10
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(worker)


# ---------------------------------------------------------------- the pieces


@pytest.mark.parametrize(
    "body, code, stderr",
    [
        ("x = 1", 0, ""),
        ("raise SystemExit", 0, ""),
        ("raise SystemExit(4)", 4, ""),
        ("raise SystemExit('no such file')", 1, "no such file\n"),
        ("raise KeyboardInterrupt", 130, "KeyboardInterrupt"),
        ("raise ValueError('bad')", 1, "ValueError: bad"),
    ],
)
def test_run_gives_python_script_exit_codes_and_runs_the_exit_functions(
    tmp_path, monkeypatch, capsys, body, code, stderr
) -> None:
    class ExitFunctions:
        ran = 0

        def _run_exitfuncs(self) -> None:
            self.ran += 1

    exit_functions = ExitFunctions()
    monkeypatch.setattr(warmworker, "atexit", exit_functions)  # this process's own must not run
    script = tmp_path / "s.py"
    script.write_text(f"assert __name__ == '__main__'\n{body}\n")
    assert warmworker.run_main(str(script)) == code
    err = capsys.readouterr().err
    assert err == stderr if code in (0, 4) or body.startswith("raise SystemExit") else stderr in err
    if code in (1, 130) and not body.startswith("raise SystemExit"):
        assert err.startswith("Traceback")
    assert exit_functions.ran == 1


def _child(body) -> int:
    """Fork, run ``body()`` in the child (its return value is the exit code) and return the child's pid."""
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            code = body()
        finally:
            os._exit(code)
    return pid


@pytest.mark.parametrize("how, code", [("exit 7", 7), ("exit 0", 0), ("SIGTERM", 128 + 15), ("SIGUSR1", 128 + 10)])
def test_wait_reports_the_workers_exit_code_or_128_plus_its_signal(how, code) -> None:
    def worker() -> int:
        if how.startswith("SIG"):
            os.kill(os.getpid(), getattr(signal, how))
            time.sleep(5)
        return int(how.split()[1])

    here, there = socket.socketpair()
    with here, there:
        assert warmworker.wait_exit(_child(worker), here) == code


def test_wait_kills_the_worker_when_the_client_hangs_up() -> None:
    pid = _child(lambda: time.sleep(30) or 0)  # before the pair: a child holding the client's end would keep it open
    here, there = socket.socketpair()
    with here:
        there.close()
        start = time.monotonic()
        assert warmworker.wait_exit(pid, here) == 128 + signal.SIGKILL
        assert time.monotonic() - start < 10


def test_the_lock_holds_our_pid_in_a_private_file_and_refuses_a_second_taker(tmp_path) -> None:
    path = tmp_path / "s.lock"
    path.write_text("a much longer previous content\n")
    fd = warmstart._lock(path)
    try:
        assert fd is not None
        assert path.read_text() == f"{os.getpid()}\n"  # truncated, then our pid
        assert warmstart._lock(path) is None  # another open file description cannot lock it
        assert warmstart._same_file(fd, path)
        path.unlink()
        assert not warmstart._same_file(fd, path)  # removed by a stopping server
        path.write_text("")
        assert not warmstart._same_file(fd, path)  # and made again by the next
    finally:
        os.close(fd)
    fresh = tmp_path / "new.lock"
    fd = warmstart._lock(fresh)
    try:
        assert fresh.stat().st_mode & 0o777 == 0o600 and fresh.read_text() == f"{os.getpid()}\n"
    finally:
        os.close(fd)


def test_a_refusal_is_one_line_on_stderr_and_means_run_cold(capsys) -> None:
    assert warmstart._refuse("/tmp/x is not private") is None
    assert capsys.readouterr() == ("", "lmclab: warm start refused, running cold: /tmp/x is not private\n")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_PDEATHSIG) is Linux only")
def test_a_forked_process_tied_to_its_parent_dies_with_it_or_at_once_if_it_is_gone() -> None:
    from lmclab.runtime.lifetime import die_with_parent

    read, write = os.pipe()

    def parent() -> int:
        def tied() -> int:
            assert die_with_parent(os.getppid()) is True
            os.write(write, f"{os.getpid()}\n".encode())
            time.sleep(30)
            return 0

        _child(tied)
        time.sleep(0.5)  # the grandchild is tied by now
        return 0

    _, status = os.waitpid(_child(parent), 0)
    os.close(write)
    grandchild = int(_read_all(read))
    deadline = time.monotonic() + 10
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert os.waitstatus_to_exitcode(status) == 0 and not _alive(grandchild)
    orphan = _child(lambda: die_with_parent(os.getppid() + 1) and 0)  # as if its parent died before prctl
    _, status = os.waitpid(orphan, 0)
    assert os.waitstatus_to_exitcode(status) == -signal.SIGKILL


def test_the_socket_name_follows_the_interpreter_and_the_import_time_environment(monkeypatch) -> None:
    name = warmstart.socket_name()
    assert name.endswith(".sock") and len(name) == 25
    monkeypatch.setenv("SOME_UNRELATED_SETTING", "1")
    assert warmstart.socket_name() == name
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    threads = warmstart.socket_name()
    assert threads != name
    monkeypatch.setattr(sys, "executable", sys.executable + "-other")
    assert warmstart.socket_name() != threads
    with contextlib.suppress(Exception):
        monkeypatch.undo()
