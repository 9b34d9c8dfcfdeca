"""No stage outlives whatever started it: a stage process dies with the ``dvc`` that started it, and
a warm-start worker with its session, so nothing writes outputs after a killed ``dvc repro`` (a rerun
started at once would race with it). Linux: ``prctl(PR_SET_PDEATHSIG, SIGKILL)``; elsewhere a no-op.
Standard library only."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent: int) -> bool:
    """Have the kernel SIGKILL this process when ``parent`` (the pid that started it, read before this
    call) exits. If ``parent`` is already gone (this process was reparented before ``prctl`` took
    effect), die now. Returns whether the tie is in place (``False`` off Linux or if prctl fails)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent:  # the parent died before prctl: the signal will never come
        os.kill(os.getpid(), signal.SIGKILL)
    return True
