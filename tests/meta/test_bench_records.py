"""The benchmarks' result records: ``--append`` keeps the earlier rows that a new run does not replace,
each naming the run (command, commit, machine) that measured it."""

from __future__ import annotations

import json
import sys

from dvc_repo import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_contention  # noqa: E402


def _row(workload: str, loops: int, setting: str, seconds: float) -> dict:
    return {"workload": workload, "busy_loops": loops, "setting": setting, "median_s": {"lmclab": seconds}}


def test_contention_append_replaces_only_the_rows_measured_again(tmp_path, monkeypatch) -> None:
    out = tmp_path / "contention.json"
    old_run = {"benchmark": "old", "workloads": ["wm", "pipeline"]}
    out.write_text(
        json.dumps({"runs": [old_run], "rows": [_row("wm", 0, "auto", 1.0), _row("pipeline", 0, "auto", 200.0)]})
    )
    monkeypatch.setattr(sys, "argv", ["bench_contention.py", "--append"])
    bench_contention.write(out, [_row("pipeline", 2, "auto", 390.0)], ["pipeline"], append=True)
    record = json.loads(out.read_text())
    assert [(r["workload"], r["busy_loops"], r["median_s"]["lmclab"]) for r in record["rows"]] == [
        ("wm", 0, 1.0),
        ("pipeline", 0, 200.0),  # another busy-loop count: kept
        ("pipeline", 2, 390.0),
    ]
    assert [record["runs"][r["run"]]["benchmark"] for r in record["rows"]][:2] == ["old", "old"]
    assert record["runs"][record["rows"][2]["run"]]["benchmark"] == "python benchmarks/bench_contention.py --append"
    bench_contention.write(out, [_row("pipeline", 0, "auto", 180.0)], ["pipeline"], append=True)
    again = json.loads(out.read_text())
    assert [r["median_s"]["lmclab"] for r in again["rows"]] == [1.0, 390.0, 180.0]  # the idle row replaced
    assert len(again["runs"]) == 3 and again["runs"][again["rows"][0]["run"]]["benchmark"] == "old"
    bench_contention.write(out, [_row("wm", 0, "auto", 2.0)], ["wm"], append=False)
    assert [r["median_s"]["lmclab"] for r in json.loads(out.read_text())["rows"]] == [2.0]


def test_contention_settings_fix_the_openmp_spin_the_stages_would_otherwise_set(monkeypatch) -> None:
    """Outside ``auto`` the spin is explicit (GNU's default, or the ``s`` count), so that a stage's own brief
    spin (``lmclab.core.threads.wait_briefly``, which yields to a set value) does not replace it."""
    import pytest

    from lmclab.core.threads import wait_briefly

    monkeypatch.setenv("GOMP_SPINCOUNT", "5")
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")  # the caller's own settings never leak in
    cases = {
        "torch": (None, "300000", None),
        "auto": (None, None, "auto"),
        "1": (None, "300000", "1"),
        "torchp": ("PASSIVE", None, None),
        "torchs": (None, "1000", None),
        "2s30000": (None, "30000", "2"),
    }
    for setting, expected in cases.items():
        env = bench_contention.setting_env(setting)
        assert (env.get("OMP_WAIT_POLICY"), env.get("GOMP_SPINCOUNT"), env.get("LMCLAB_THREADS")) == expected
        for key in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY"):
            monkeypatch.delenv(key, raising=False)
            if key in env:
                monkeypatch.setenv(key, env[key])
        wait_briefly()  # what a stage does first
        assert bench_contention.os.environ.get("GOMP_SPINCOUNT") == (expected[1] or (None if expected[0] else "1000"))
    for bad in ("torchx", "0", "auto p", "s1000", "1sx"):
        with pytest.raises(SystemExit, match="--settings"):
            bench_contention.parse_setting(bad)
