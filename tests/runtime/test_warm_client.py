"""The warm-start client in the test's own process (the other tests run it in a stage's process, out of
the sight of coverage and mutation tools): it starts a server, hands it the script with this process's
argv, cwd, environment and stdio, and returns the worker's exit code; a second call finds the server."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_warmstart import warm_env  # noqa: F401 (a fixture)

from lmclab.runtime import warmstart


def test_a_client_in_this_process_runs_a_script_warm_and_returns_its_exit_code(
    tmp_path,
    warm_env,  # noqa: F811 (the fixture imported above)
    monkeypatch,
    capfd,
) -> None:
    for key in ("LMCLAB_WARM_DIR", "LMCLAB_WARM_IDLE", "PROBE"):
        monkeypatch.setenv(key, warm_env[key])
    monkeypatch.delenv("LMCLAB_WARM", raising=False)
    monkeypatch.chdir(tmp_path)
    script = str(tmp_path / "script.py")
    assert warmstart.enabled()
    assert warmstart.run_script(script, ["3"]) == 3  # the server is started, then the script runs
    first = capfd.readouterr()
    spawned = []
    monkeypatch.setattr(warmstart, "_spawn_server", lambda path: spawned.append(path))
    assert warmstart.run_script(script, ["0"]) == 0  # the same server, found without starting another
    second = capfd.readouterr()
    assert spawned == []
    for out, argv in ((first, ["3"]), (second, ["0"])):
        warm, torch_loaded, _, cwd, probe, *rest = out.out.split(" ", 5)
        assert (warm, torch_loaded, cwd, probe) == ("warm", "True", str(tmp_path), "p1"), out
        assert out.out.endswith(f"{argv!r} 1\n"), out
        assert out.err == "to stderr\n"
    servers = [p for p in os.listdir(warm_env["LMCLAB_WARM_DIR"]) if p.endswith(".sock")]
    assert servers == [warmstart.socket_name()]
    if os.path.isdir("/proc/self/fd"):  # detached: no pipe of ours (DVC and pytest would wait on it), cwd /
        lock = os.path.join(warm_env["LMCLAB_WARM_DIR"], servers[0].replace(".sock", ".lock"))
        server = int(Path(lock).read_text())
        assert [os.readlink(f"/proc/{server}/fd/{fd}") for fd in (0, 1, 2)] == ["/dev/null"] * 3
        assert os.readlink(f"/proc/{server}/cwd") == "/" and os.getsid(server) == server


def test_warm_start_is_off_when_asked_or_inside_a_worker(monkeypatch) -> None:
    monkeypatch.delenv(warmstart.WORKER_ENV, raising=False)
    monkeypatch.setenv("LMCLAB_WARM", "0")
    assert not warmstart.enabled() and warmstart.run_script("x.py", []) is None
    monkeypatch.setenv("LMCLAB_WARM", "1")
    assert warmstart.enabled()
    monkeypatch.setenv(warmstart.WORKER_ENV, "1")
    assert not warmstart.enabled()


def test_a_stop_signal_unwinds_the_server_and_ends_a_forked_session_at_once() -> None:
    """In the server, SIGTERM raises SystemExit(128 + 15) so that its cleanup runs; in a session forked
    from it (another pid), the process exits with that status without running the server's cleanup."""
    import signal

    with pytest.raises(SystemExit) as stopped:
        warmstart._stop(signal.SIGTERM, os.getpid())
    assert stopped.value.code == 128 + signal.SIGTERM
    child = os.fork()
    if child == 0:  # the session: never returns here, whatever _stop does
        try:
            warmstart._stop(signal.SIGTERM, os.getppid())
        finally:
            os._exit(1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 128 + signal.SIGTERM
