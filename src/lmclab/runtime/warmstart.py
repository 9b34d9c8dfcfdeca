"""Warm start for stage processes: run a stage script in a fork of a process that already imported
torch (with torch._dynamo, which the first optimizer imports), numpy, scipy, pandas, pyarrow, matplotlib,
pydantic and dvclive, instead of paying those ~4 s of imports in every one of the pipeline's ~30 stage
processes.

How it works (a zygote, like a build tool's daemon): ``run_script(script, argv)`` (called by a stage
script's ``__main__``) connects to a per-user Unix socket. Nobody listening → it starts the *server* (a
detached process that imports the heavy modules, then waits; it exits after ``LMCLAB_WARM_IDLE``
seconds, default 60, without a request, or on SIGTERM or SIGHUP, and removes its socket and lock file).
For each request the server forks a *session*, which forks a *worker* that takes over the client's
working directory, environment, umask, stdin/stdout/stderr (passed over the socket), ``sys.argv`` and
``sys.path[0]``, runs the script as ``__main__`` and exits with its exit code; the session reports the
code to the client, which exits with it. Signals the client receives (Ctrl-C, DVC stopping a stage) are
forwarded to the worker; a killed client takes its worker along (SIGKILL when its end of the socket
closes) and a worker dies with its session (``lmclab.runtime.lifetime``). Only the current user is
trusted (``lmclab.runtime.trust``: private directory, 0600 socket and lock, ``SO_PEERCRED`` on both
ends). Nothing of lmclab or of the stage is imported before the fork, so an edited source file is always
the one that runs; the socket's name hashes the interpreter, its installed packages (site-packages
modification times), the server's own source files and the environment variables read at import time, so
a changed environment gets its own server.

Results are the same as in a fresh process (stages seed every generator explicitly; tested).
``LMCLAB_WARM=0`` turns it off; so does any failure to reach the server (the stage then runs in the
calling process, as it would without this module); ``--help`` and command lines the stage refuses never
get here (``lmclab.pipeline.stage.run_warm`` parses them first). POSIX only (``fork``, ``SCM_RIGHTS``);
elsewhere stages simply run in place. This module imports only the standard library.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import NoReturn

from lmclab.runtime import lifetime, trust, warmworker
from lmclab.runtime.lifetime import die_with_parent
from lmclab.runtime.trust import owner_only_umask, peer_problem, private_dir_problem, warm_dir
from lmclab.runtime.warmworker import WORKER_ENV, become_client, kill, wait_exit

PRELOAD = (
    "numpy",
    "torch",
    "scipy.optimize",
    "scipy.linalg",
    "pandas",
    "pyarrow.parquet",
    "typer",
    "yaml",
    "tqdm",
    "matplotlib.pyplot",
    "torch._dynamo",  # imported by the first torch.optim optimizer (train, every learned search): ~1 s
    "dvclive",  # the train stage's live metrics
    "pydantic",  # every method's options
)
IMPORT_TIME_ENV = ("PYTHON", "OMP_", "GOMP_", "MKL_", "OPENBLAS_", "CUDA_", "TORCH_", "PYTORCH_", "MPL", "LD_", "KMP_")
_HELLO, _MAX_MESSAGE = b"lmclab-warm 1\n", 1 << 20


def enabled() -> bool:
    """Warm start is used unless ``LMCLAB_WARM=0``, inside a worker, or without fork/SCM_RIGHTS/SO_PEERCRED."""
    return (
        os.environ.get("LMCLAB_WARM", "1") != "0"
        and WORKER_ENV not in os.environ
        and hasattr(os, "fork")
        and hasattr(socket, "send_fds")
        and hasattr(socket, "SO_PEERCRED")
    )


def socket_name() -> str:
    """The server's socket for this interpreter, its packages, its source files and the import-time env."""
    parts = [sys.executable, sys.prefix, sys.version]
    parts += [
        f"{f}:{os.stat(f).st_mtime_ns}" for f in (__file__, trust.__file__, lifetime.__file__, warmworker.__file__)
    ]
    for entry in sys.path:
        if entry.startswith(sys.prefix) and os.path.isdir(entry):
            parts.append(f"{entry}:{os.stat(entry).st_mtime_ns}")
    parts += sorted(f"{k}={v}" for k, v in os.environ.items() if k.startswith(IMPORT_TIME_ENV))
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:20] + ".sock"


# ---------------------------------------------------------------- client


def run_script(script: str, argv: list[str]) -> int | None:
    """Run ``script argv`` in a warm worker and return its exit code; ``None`` if that was not possible
    (the caller then runs the stage itself). Never runs the stage twice: the request is sent only
    after the server's greeting, and a failure before the greeting means nothing was started."""
    if not enabled():
        return None
    root, problem = warm_dir()
    if problem:
        return _refuse(f"{root} {problem}")
    path = root / socket_name()
    conn = _connect(path) or (_connect(path, retries=40) if _spawn_server(path) else None)
    if conn is None:
        return None
    with conn:
        if problem := peer_problem(conn):
            return _refuse(f"{path}: its server {problem}")
        try:
            conn.settimeout(float(os.environ.get("LMCLAB_WARM_WAIT", "120")))
            if conn.recv(len(_HELLO), socket.MSG_WAITALL) != _HELLO:
                return None
            conn.settimeout(None)
            request = {
                "script": os.path.abspath(script),
                "argv": argv,
                "cwd": os.getcwd(),
                "env": dict(os.environ),
                "umask": _umask(),
            }
            socket.send_fds(conn, [json.dumps(request).encode() + b"\n"], [0, 1, 2])
        except OSError:
            return None
        return _follow(conn)


def _refuse(reason: str) -> None:
    """One line on stderr; the caller then runs the stage cold."""
    print(f"lmclab: warm start refused, running cold: {reason}", file=sys.stderr, flush=True)


def _connect(path: Path, retries: int = 0) -> socket.socket | None:
    for attempt in range(retries + 1):
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(str(path))
            return conn
        except OSError:
            conn.close()
            if attempt < retries:
                select.select([], [], [], 0.05)
    return None


def _spawn_server(path: Path) -> bool:
    """Start a detached server (no inherited pipes: DVC and pytest must not wait for it)."""
    try:
        src = str(Path(__file__).resolve().parents[2])
        code = f"import sys; sys.path[0] = {src!r}; from lmclab.runtime.warmstart import serve; serve({str(path)!r})"
        subprocess.Popen(
            [os.path.abspath(sys.executable), "-c", code],  # relative when PATH held a relative dir; cwd is /
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
            cwd="/",
        )
        return True
    except OSError:
        return False


def _follow(conn: socket.socket) -> int:
    """Forward signals to the worker until the session reports its exit code."""
    reader = conn.makefile("rb")
    started = json.loads(reader.readline() or b"{}")
    pid = started.get("pid")
    if pid is None:
        return 1
    forward = lambda signum, _frame: kill(pid, signum)  # noqa: E731
    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        return int(json.loads(reader.readline())["exit"])  # EOF (session gone) -> ValueError -> 1
    except (ValueError, KeyError, OSError):
        return 1
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _umask() -> int:
    os.umask(mask := os.umask(0))
    return mask


# ---------------------------------------------------------------- server


def serve(path: str) -> None:
    """Bind ``path``, import the heavy modules, then fork a session per connection until idle or stopped
    (SIGTERM, SIGHUP); either way the socket and the lock file are removed."""
    sock_path, lock_path = Path(path), Path(path).with_suffix(".lock")
    if private_dir_problem(sock_path.parent, create=False):
        return  # the client checked it; something changed since
    lock = _lock(lock_path)
    if lock is None:
        return  # another server owns this socket
    server = os.getpid()
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, lambda signum, _frame: _stop(signum, server))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock_path.unlink(missing_ok=True)
        with owner_only_umask():  # the socket is 0600
            listener.bind(path)
        listener.listen(64)
        for module in PRELOAD:  # clients already queue on the socket meanwhile
            with contextlib.suppress(Exception):  # a missing optional module is imported by the stage itself
                importlib.import_module(module)
        _accept(listener, lock)
    finally:
        sock_path.unlink(missing_ok=True)
        lock_path.unlink(missing_ok=True)  # still locked: a server starting now locks a new file
        listener.close()
        os.close(lock)


def _stop(signum: int, server: int) -> NoReturn:
    """A stop signal: the server unwinds through its cleanup; a session forked before it reset the
    handler just exits (the server's socket and lock are not its to remove)."""
    if os.getpid() != server:
        os._exit(128 + signum)
    raise SystemExit(128 + signum)


def _accept(listener: socket.socket, lock: int) -> None:
    """Fork a session per connection of this user until ``LMCLAB_WARM_IDLE`` seconds pass without one."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # sessions are reaped automatically
    idle = float(os.environ.get("LMCLAB_WARM_IDLE", "60"))
    while select.select([listener], [], [], idle)[0]:
        conn, _ = listener.accept()
        if peer_problem(conn):  # another uid: close before reading or running anything
            conn.close()
            continue
        if os.fork() == 0:
            listener.close()
            os.close(lock)  # a long stage must not keep the next server from taking the lock
            for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
                signal.signal(signum, signal.SIG_DFL)
            _session(conn)
        conn.close()


def _lock(path: Path) -> int | None:
    """Lock ``path`` (0600, no symlink) and write our pid (for `kill $(cat <dir>/*.lock)`); ``None``: taken.
    A file a stopping server removed between our open and our lock is left for the one now at ``path``."""
    for _ in range(3):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return None
        if _same_file(fd, path):
            os.ftruncate(fd, 0)  # only now: truncating before the lock would erase a running server's pid
            os.write(fd, f"{os.getpid()}\n".encode())
            return fd
        os.close(fd)
    return None


def _same_file(fd: int, path: Path) -> bool:
    try:
        here, there = os.fstat(fd), os.lstat(path)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _session(conn: socket.socket) -> NoReturn:
    """Greet, receive the request and the client's stdio, fork the worker, report its exit code."""
    try:
        conn.sendall(_HELLO)
        message, fds, _, _ = socket.recv_fds(conn, _MAX_MESSAGE, 3)
        while message and not message.endswith(b"\n"):
            chunk = conn.recv(_MAX_MESSAGE)
            message = message + chunk if chunk else b""
        if not message or len(fds) != 3:
            os._exit(0)
        session = os.getpid()
        pid = os.fork()
        if pid == 0:
            die_with_parent(session)
            conn.close()
            become_client(json.loads(message), fds)
        for fd in fds:
            os.close(fd)
        conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        conn.sendall(json.dumps({"exit": wait_exit(pid, conn)}).encode() + b"\n")
    finally:
        os._exit(0)
