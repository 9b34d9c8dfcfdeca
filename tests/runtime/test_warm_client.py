"""The warm-start client in the test's own process (the other tests run it in a stage's process, out of
the sight of coverage and mutation tools): it starts a server, hands it the script with this process's
argv, cwd, environment and stdio, and returns the worker's exit code; a second call finds the server."""

from __future__ import annotations

import os

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
    assert warmstart.run_script(script, ["0"]) == 0  # the same server
    second = capfd.readouterr()
    for out, argv in ((first, ["3"]), (second, ["0"])):
        warm, torch_loaded, _, cwd, probe, *rest = out.out.split(" ", 5)
        assert (warm, torch_loaded, cwd, probe) == ("warm", "True", str(tmp_path), "p1"), out
        assert out.out.endswith(f"{argv!r} 1\n"), out
        assert out.err == "to stderr\n"
    servers = [p for p in os.listdir(warm_env["LMCLAB_WARM_DIR"]) if p.endswith(".sock")]
    assert servers == [warmstart.socket_name()]


def test_warm_start_is_off_when_asked_or_inside_a_worker(monkeypatch) -> None:
    monkeypatch.delenv(warmstart.WORKER_ENV, raising=False)
    monkeypatch.setenv("LMCLAB_WARM", "0")
    assert not warmstart.enabled() and warmstart.run_script("x.py", []) is None
    monkeypatch.setenv("LMCLAB_WARM", "1")
    assert warmstart.enabled()
    monkeypatch.setenv(warmstart.WORKER_ENV, "1")
    assert not warmstart.enabled()
