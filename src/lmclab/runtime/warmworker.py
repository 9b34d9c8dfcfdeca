"""What a session of the warm-start server (:mod:`lmclab.runtime.warmstart`) runs for one request, in
its forks: the worker, which becomes the client's process (working directory, environment, umask, stdio,
``sys.argv``) and runs the stage script as ``__main__`` with ``python script``'s exit codes; and the
session's wait for that worker's exit, which takes the worker along when the client hangs up. Standard
library only, like the server."""

from __future__ import annotations

import atexit
import contextlib
import os
import runpy
import select
import signal
import socket
import sys
import traceback
from typing import NoReturn

WORKER_ENV = "LMCLAB_WARM_WORKER"  # set inside a worker: the stage runs in place


def kill(pid: int, signum: int) -> None:
    """Send ``signum`` to ``pid`` unless it is gone."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


def wait_exit(pid: int, conn: socket.socket) -> int:
    """The worker's exit code (128 + signal if killed). A client that hangs up was killed (the signals
    it can catch are forwarded instead): its worker is SIGKILLed too, as a cold stage would have been."""
    pidfd = os.pidfd_open(pid) if hasattr(os, "pidfd_open") else None
    watch = [conn] + ([pidfd] if pidfd is not None else [])
    while True:
        readable = select.select(watch, [], [], None if pidfd is not None else 0.05)[0]
        if conn in readable and not conn.recv(1):  # the client is gone: so is its worker
            kill(pid, signal.SIGKILL)
            watch = [w for w in watch if w is not conn]
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            return code if code >= 0 else 128 - code


def become_client(request: dict, fds: list[int]) -> NoReturn:
    """Become the client's process (cwd, env, umask, stdio, argv) and run the script as ``__main__``."""
    code = 1
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"], **{WORKER_ENV: "1"})
        os.umask(request["umask"])
        sys.stdin = sys.__stdin__ = open(0, closefd=False)  # noqa: SIM115
        sys.stdout = sys.__stdout__ = open(1, "w", buffering=1 if os.isatty(1) else -1, closefd=False)  # noqa: SIM115
        sys.stderr = sys.__stderr__ = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        for signum in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for name in [m for m in sys.modules if m == "lmclab" or m.startswith("lmclab.")]:
            del sys.modules[name]  # the stage imports its own checkout's lmclab
        sys.argv, sys.path[0] = [request["script"], *request["argv"]], os.path.dirname(request["script"])
        code = run_main(request["script"])
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # a closed pipe: nothing left to report
                stream.flush()
        os._exit(code)


def run_main(script: str) -> int:
    """``python script`` semantics: SystemExit's code, 1 and a traceback on an exception, 130 on Ctrl-C."""
    try:
        runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except KeyboardInterrupt:
        traceback.print_exc()
        code = 130
    except BaseException:
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()
    return code
