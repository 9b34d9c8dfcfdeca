"""A warm-start server stopped by SIGTERM or SIGHUP, in the test's own process: it unwinds through its
cleanup (no socket, no lock left) and ends with 128 + the signal's number, as a process killed by it would."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path

import pytest

from lmclab.runtime import warmstart

pytestmark = pytest.mark.skipif(not warmstart.enabled(), reason="warm start needs fork, SCM_RIGHTS and SO_PEERCRED")


@pytest.fixture()
def server_dir():
    where = Path(tempfile.mkdtemp(prefix="lw-"))  # 0700, and short: socket names are limited to ~100 bytes
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD)}  # serve sets them
    yield where
    for signum, handler in saved.items():
        signal.signal(signum, handler)
    shutil.rmtree(where, ignore_errors=True)


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_a_stopped_server_exits_with_128_plus_the_signal_and_leaves_nothing(server_dir, monkeypatch, stop) -> None:
    monkeypatch.setattr(warmstart, "PRELOAD", ())
    monkeypatch.setenv("LMCLAB_WARM_IDLE", "30")
    path = server_dir / "s.sock"

    def stop_when_bound() -> None:
        deadline = time.monotonic() + 30
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(os.getpid(), stop)

    sender = threading.Thread(target=stop_when_bound)
    sender.start()
    with pytest.raises(SystemExit) as stopped:
        warmstart.serve(str(path))
    sender.join()
    assert stopped.value.code == 128 + stop
    assert list(server_dir.iterdir()) == []
