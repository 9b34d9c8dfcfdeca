"""Whom warm start trusts: only its own user. The server's socket lives in a directory that only the
current user can enter (``$XDG_RUNTIME_DIR/lmclab-warm``, else ``$TMPDIR/lmclab-warm-$UID``, or
``$LMCLAB_WARM_DIR``), and both ends of every connection check with ``SO_PEERCRED`` that the other
end runs as the same uid. Without these checks another local user could create the directory first,
put their own socket there and receive a stage's environment and stdio and forge its results.
Standard library only (imported by every stage process before its heavy imports)."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path

PRIVATE_MODE = 0o700
_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def warm_dir() -> tuple[Path, str | None]:
    """The directory for the server's socket and lock, and why it must not be used (``None``: it is
    private). ``$LMCLAB_WARM_DIR`` if set, else ``lmclab-warm`` in ``$XDG_RUNTIME_DIR`` (itself checked)
    if set, else ``lmclab-warm-$UID`` in the temp directory; a missing directory is created 0700."""
    override, runtime = os.environ.get("LMCLAB_WARM_DIR"), os.environ.get("XDG_RUNTIME_DIR")
    if override:
        path = Path(override)
    elif runtime:
        problem = private_dir_problem(Path(runtime), create=False)
        if problem:
            return Path(runtime), problem
        path = Path(runtime) / "lmclab-warm"
    else:
        path = Path(tempfile.gettempdir()) / f"lmclab-warm-{os.getuid()}"
    return path, private_dir_problem(path)


def private_dir_problem(path: Path, *, create: bool = True) -> str | None:
    """Why ``path`` is not a private directory of this user (``lstat``: not a symlink, a directory,
    owned by ``os.getuid()``, mode exactly 0700), or ``None`` if it is. With ``create``, a missing
    directory is created 0700 first; losing that race to someone else is caught by the checks."""
    if create:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            os.mkdir(path, PRIVATE_MODE)
        except FileExistsError:
            pass  # ours from an earlier run, or someone else's: the checks below decide
        except OSError as exc:
            return f"cannot create it ({exc.strerror})"
    try:
        info = os.lstat(path)
    except OSError as exc:
        return f"cannot stat it ({exc.strerror})"
    if stat.S_ISLNK(info.st_mode):
        return "is a symlink"
    if not stat.S_ISDIR(info.st_mode):
        return "is not a directory"
    if info.st_uid != os.getuid():
        return f"is owned by uid {info.st_uid}, not by this user (uid {os.getuid()})"
    if stat.S_IMODE(info.st_mode) != PRIVATE_MODE:
        return f"has mode {stat.S_IMODE(info.st_mode):04o}, expected 0700"
    return None


@contextlib.contextmanager
def owner_only_umask() -> Iterator[None]:
    """Files and sockets created inside are 0600 (``bind`` has no mode argument: it obeys the umask)."""
    previous = os.umask(0o177)
    try:
        yield
    finally:
        os.umask(previous)


def peer_uid(conn: socket.socket) -> int:
    """The uid of the process at the other end of a connected Unix socket (``SO_PEERCRED``: the
    credentials it had when it called ``connect`` or ``listen``)."""
    _pid, uid, _gid = _UCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return uid


def peer_problem(conn: socket.socket) -> str | None:
    """Why the peer of ``conn`` is not trusted (it runs as another uid, or that cannot be told), or
    ``None`` if it runs as this process's uid."""
    try:
        uid = peer_uid(conn)
    except (OSError, AttributeError) as exc:  # AttributeError: no SO_PEERCRED on this platform
        return f"cannot be identified ({exc})"
    return None if uid == os.getuid() else f"runs as uid {uid}, not as this user (uid {os.getuid()})"
