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
