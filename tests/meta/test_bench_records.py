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
    old_run = {"command": "old", "workloads": ["wm", "pipeline"]}
    out.write_text(
        json.dumps(
            {
                "runs": [old_run],
                "rows": [{**_row("wm", 0, "auto", 1.0), "run": 0}, {**_row("pipeline", 0, "auto", 200.0), "run": 0}],
            }
        )
    )
    monkeypatch.setattr(sys, "argv", ["benchmarks/bench_contention.py", "--append"])
    bench_contention.write(out, [_row("pipeline", 2, "auto", 390.0)], ["pipeline"], append=True)
    record = json.loads(out.read_text())
    assert [(r["workload"], r["busy_loops"], r["median_s"]["lmclab"]) for r in record["rows"]] == [
        ("wm", 0, 1.0),
        ("pipeline", 0, 200.0),  # another busy-loop count: kept
        ("pipeline", 2, 390.0),
    ]
    assert [record["runs"][r["run"]]["command"] for r in record["rows"]][:2] == ["old", "old"]
    assert record["runs"][record["rows"][2]["run"]]["command"] == "python benchmarks/bench_contention.py --append"
    bench_contention.write(out, [_row("pipeline", 0, "auto", 180.0)], ["pipeline"], append=True)
    again = json.loads(out.read_text())
    assert [r["median_s"]["lmclab"] for r in again["rows"]] == [1.0, 390.0, 180.0]  # the idle row replaced
    assert len(again["runs"]) == 3 and again["runs"][again["rows"][0]["run"]]["command"] == "old"
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


def test_a_record_names_its_run_shell_quoted_with_commit_date_and_machine(tmp_path, monkeypatch) -> None:
    """benchmarks/record.py: the argv shell-quoted from the repository's root, the commit and machine as
    every record of the project names them, each row with its run; ``keep`` keeps earlier rows with theirs."""
    import record

    monkeypatch.setattr(sys, "argv", [str(ROOT / "benchmarks" / "bench_x.py"), "--note", "two words"])
    out = tmp_path / "deep" / "x.json"
    written = record.record(out, [{"n": 1}, {"n": 2}], run=record.this_run(repeats=3), extra={"k": 1})
    assert json.loads(out.read_text()) == written
    (run,) = written["runs"]
    assert run["command"] == "python benchmarks/bench_x.py --note 'two words'" and run["repeats"] == 3
    assert {"cpu", "cores", "torch"} <= set(run["machine"]) and run["date"].endswith(" UTC") and run["commit"]
    assert written["rows"] == [{"n": 1, "run": 0}, {"n": 2, "run": 0}] and written["extra"] == {"k": 1}
    again = record.record(out, [{"n": 3}], run={"command": "b"}, keep=lambda r: r["n"] == 2)
    assert again["runs"] == [run, {"command": "b"}] and again["rows"] == [{"n": 2, "run": 0}, {"n": 3, "run": 1}]


def test_every_committed_result_is_in_the_one_shape() -> None:
    """Each file of benchmarks/results/: runs naming command, commit, date and machine, rows naming a run."""
    files = sorted((ROOT / "benchmarks" / "results").iterdir())
    assert files and all(f.suffix == ".json" for f in files), files
    for path in files:
        result = json.loads(path.read_text())
        assert result["runs"] and result["rows"], path.name
        for run in result["runs"]:
            assert {"command", "commit", "date", "machine"} <= set(run), path.name
            assert run["command"].startswith("python benchmarks/"), path.name
        assert all(0 <= row["run"] < len(result["runs"]) for row in result["rows"]), path.name


def test_auto_picks_the_solver_the_committed_widths_measured_faster() -> None:
    """``lap_backend: auto``'s width (``lmclab.core.assignment.AUTO_SCIPY_FROM``) against
    benchmarks/results/lap_widths.json: below it lapx took less time than scipy over both kinds of cost at
    every measured width, from it not less; a new measurement that moves the crossing fails here."""
    from lmclab.core.assignment import AUTO, resolve_backend

    rows = json.loads((ROOT / "benchmarks" / "results" / "lap_widths.json").read_text())["rows"]
    total: dict[int, dict[str, float]] = {}
    for row in rows:
        for solver, seconds in row["seconds"].items():
            total.setdefault(row["n"], {}).setdefault(solver, 0.0)
            total[row["n"]][solver] += seconds
    assert len(total) >= 4 and min(total) < 4096 and max(total) > 12000  # both sides, measured
    for n, seconds in total.items():
        assert resolve_backend(AUTO, n) == min(seconds, key=seconds.get), (n, seconds)
