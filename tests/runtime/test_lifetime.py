"""lmclab.runtime.lifetime: a process tied with ``die_with_parent`` is SIGKILLed when its parent dies, and
dies at once if its parent was already gone when it asked; off Linux nothing is tied, and the call says so."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_PDEATHSIG) is Linux only")

CHILD = (
    "import os, time; from lmclab.runtime.lifetime import die_with_parent; "
    "die_with_parent(os.getppid()); time.sleep(60)"
)
PARENT = f"""
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", {CHILD!r}])
print(child.pid, flush=True)
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_tied_process_is_killed_when_its_parent_is() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    time.sleep(1)  # the child has called die_with_parent by now (it only imports the standard library)
    assert _alive(child)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        assert not _alive(child)
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)


def test_a_process_whose_parent_is_already_gone_dies_at_once() -> None:
    # as if the parent had died between reading its pid and prctl: getppid() no longer matches
    code = (
        "import os; from lmclab.runtime.lifetime import die_with_parent; "
        "die_with_parent(os.getppid() + 1); print('ran on')"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL and proc.stdout == ""


def test_off_linux_nothing_is_tied_and_the_process_is_told_so(monkeypatch) -> None:
    from lmclab.runtime.lifetime import die_with_parent

    monkeypatch.setattr(sys, "platform", "darwin")
    assert die_with_parent(os.getppid()) is False
