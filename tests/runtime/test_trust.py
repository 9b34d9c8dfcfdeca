"""Whom warm start trusts, in this process: which directory it picks and why one is refused, and the uid
of a socket's peer (the server and client tests run these across processes, out of a test's sight)."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from lmclab.runtime import trust


def test_a_missing_directory_is_created_private_and_a_file_or_link_is_refused(tmp_path, monkeypatch) -> None:
    previous = os.umask(0)  # the mode must not depend on the umask
    try:
        made = tmp_path / "deep" / "warm"
        assert trust.private_dir_problem(made) is None
        assert stat.S_IMODE(os.lstat(made).st_mode) == 0o700
    finally:
        os.umask(previous)
    (tmp_path / "file").write_text("")
    assert trust.private_dir_problem(tmp_path / "file") == "is not a directory"
    (tmp_path / "link").symlink_to(made)
    assert trust.private_dir_problem(tmp_path / "link") == "is a symlink"
    assert trust.private_dir_problem(tmp_path / "absent", create=False).startswith("cannot stat it (")


def test_the_runtime_directory_is_checked_as_it_is_never_created(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("LMCLAB_WARM_DIR", raising=False)
    runtime = tmp_path / "run-user"
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert trust.warm_dir() == (runtime, f"cannot stat it ({os.strerror(2)})")
    assert not runtime.exists()
    runtime.mkdir(mode=0o700)
    runtime.chmod(0o700)
    assert trust.warm_dir() == (runtime / "lmclab-warm", None)
    monkeypatch.setenv("LMCLAB_WARM_DIR", str(tmp_path / "mine"))
    assert trust.warm_dir() == (tmp_path / "mine", None)
    monkeypatch.delenv("LMCLAB_WARM_DIR")
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(trust.tempfile, "tempdir", None)  # re-read TMPDIR
    assert trust.warm_dir() == (tmp_path / f"lmclab-warm-{os.getuid()}", None)


def test_a_peer_of_this_uid_is_trusted_and_one_that_cannot_be_identified_is_not(monkeypatch) -> None:
    a, b = socket.socketpair(socket.AF_UNIX)
    with a, b:
        assert trust.peer_uid(a) == os.getuid() and trust.peer_problem(a) is None
        monkeypatch.setattr(trust.os, "getuid", lambda: os.geteuid() + 1)
        assert trust.peer_problem(a) == f"runs as uid {os.geteuid()}, not as this user (uid {os.geteuid() + 1})"

    class Unknown:
        def getsockopt(self, *args):
            raise OSError("no credentials")

    assert trust.peer_problem(Unknown()) == "cannot be identified (no credentials)"


@pytest.mark.parametrize("mode", [0o755, 0o600])
def test_a_directory_of_another_mode_is_refused_by_its_mode(tmp_path: Path, mode: int) -> None:
    folder = tmp_path / "warm"
    folder.mkdir()
    folder.chmod(mode)
    assert trust.private_dir_problem(folder) == f"has mode {mode:04o}, expected 0700"
