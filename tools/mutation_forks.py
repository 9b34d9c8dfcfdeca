"""A pytest plugin for mutation runs (``tools/mutation.py`` loads it): credits each test with the library
functions that the processes it forks call.

mutmut learns which tests to run for a mutant by recording, per test, the functions called in the test's
own process. A function that runs only in a process the test forks (the warm-start server's session and
worker, a child tied to its parent) was recorded for no test, so all its mutants counted as "no test"
although tests exercise it. While mutmut records (its mutant is ``stats``), this plugin has every forked
process append the functions it calls to a file in a private spool directory, and adds them to the test's
record before mutmut files it. Processes started with ``exec`` (``subprocess``) are not covered: they run
a fresh interpreter without this plugin.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

_spool: Path | None = None


def _recording() -> bool:
    from mutmut.mutation.trampoline import get_mutant_under_test

    return get_mutant_under_test() == "stats"


def pytest_configure(config: pytest.Config) -> None:
    global _spool
    if not _recording():
        return
    from mutmut.mutation import trampoline

    _spool = Path(tempfile.mkdtemp(prefix="mutmut-forks-"))  # 0700: only this user reads or writes it
    parent, record = os.getpid(), trampoline.record_trampoline_hit

    def record_here_or_in_a_fork(name: str, caller: str | None = None) -> None:
        record(name, caller)
        if os.getpid() != parent:  # a forked process: its own copy of the record is lost when it exits
            with open(_spool / str(os.getpid()), "a") as f:
                f.write(name + "\n")

    trampoline.record_trampoline_hit = record_here_or_in_a_fork


@pytest.hookimpl(tryfirst=True)  # before mutmut's own teardown hook files the test's record
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if _spool is None:
        return
    from mutmut.state import state

    for path in list(_spool.iterdir()):
        state()._stats.update(path.read_text().split())
        path.unlink()


def pytest_unconfigure(config: pytest.Config) -> None:
    if _spool is not None:
        shutil.rmtree(_spool, ignore_errors=True)
