"""The suite keeps its cost: the committed record of its times (``tests/durations.json``, written by
``make durations``) holds both tiers within their budgets and no test of the fast tier above the
per-test budget; the record is not older than the test files; docs/testing.md shows what it holds; and
every test of an optional extra is marked so that ``make test-fast`` leaves it out."""

from __future__ import annotations

import copy
import json
import re
import sys
from pathlib import Path

from dvc_repo import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import test_durations as cost  # noqa: E402

RECORD = json.loads(cost.RECORD.read_text()) if cost.RECORD.is_file() else {}  # each test fails without it
EXTRAS = ("timm", "transformers", "datasets")  # pyproject.toml's [models] and [text] extras


def test_both_tiers_were_measured_at_the_makefiles_worker_count():
    assert re.search(rf"^WORKERS \?= {cost.WORKERS}$", (ROOT / "Makefile").read_text(), re.M)
    for tier in ("fast", "full"):
        run = RECORD["tiers"][tier][str(cost.WORKERS)]
        assert run["tests"] > 0 and run["commit"] and run["machine"], tier
    assert RECORD["per_test"]["workers"] == cost.WORKERS


def test_the_record_keeps_every_budget():
    assert cost.over_budget(RECORD) == [], "make a test faster or mark it slow; then `make durations`"


def test_a_broken_budget_is_named():
    record = copy.deepcopy(RECORD)
    fast = next(n for n, t in record["per_test"]["tests"].items() if t["fast"])
    record["per_test"]["tests"][fast]["seconds"] = cost.BUDGETS["test"] + 0.1
    record["tiers"]["fast"][str(cost.WORKERS)]["seconds"] = cost.BUDGETS["fast"] + 1
    slow = next(n for n, t in record["per_test"]["tests"].items() if not t["fast"])
    record["per_test"]["tests"][slow]["seconds"] = 10 * cost.BUDGETS["test"]  # only the fast tier has a budget
    found = cost.over_budget(record)
    assert len(found) == 2 and found[0].startswith("`make test-fast` took") and found[1].startswith(fast)


def test_the_record_covers_every_test_file():
    recorded = {nodeid.split("::")[0] for nodeid in RECORD["per_test"]["tests"]}
    files = {p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("test_*.py")}
    this = Path(__file__).relative_to(ROOT).as_posix()  # `make durations` leaves out the checks of its record
    assert files - recorded == {this}, "new test files since the record: run `make durations`"


def test_the_docs_show_the_record():
    assert cost.render() == cost.PAGE.read_text(), "run `python tools/test_durations.py`"


def test_every_test_of_an_optional_extra_is_marked_extras():
    names = "|".join(EXTRAS)
    uses = re.compile(rf"""importorskip\(["']({names})["']\)|^\s*(import|from) ({names})\b""", re.M)
    unmarked = [
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "tests").rglob("*.py")
        if uses.search(text := p.read_text()) and "pytest.mark.extras" not in text
    ]
    assert unmarked == [], "mark them `pytestmark = pytest.mark.extras` (left out of `make test-fast`)"


def test_under_xdist_the_longest_recorded_files_come_first_and_the_tiny_runs_tests_are_slow(tmp_path, monkeypatch):
    import suite_cost

    class Item:
        def __init__(self, nodeid: str) -> None:
            self.nodeid, self.fixturenames, self.markers = nodeid, ("tiny_run",) if "new" in nodeid else (), []

        def add_marker(self, marker) -> None:
            self.markers.append(marker.name)

    record = {
        "per_test": {"tests": {"b.py::x": {"seconds": 5.0}, "b.py::y": {"seconds": 5.0}, "c.py::z": {"seconds": 9.0}}}
    }
    (tmp_path / "durations.json").write_text(json.dumps(record))
    monkeypatch.setattr(suite_cost, "RECORD", tmp_path / "durations.json")
    items = [Item(n) for n in ("a.py::new", "b.py::y", "b.py::x", "c.py::z")]
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    suite_cost.pytest_collection_modifyitems(None, items)
    assert [i.nodeid for i in items] == ["a.py::new", "b.py::y", "b.py::x", "c.py::z"]  # one process: as collected
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    suite_cost.pytest_collection_modifyitems(None, items)
    assert [i.nodeid for i in items] == ["b.py::y", "b.py::x", "c.py::z", "a.py::new"]  # 10 s, 9 s, then unrecorded
    assert [i.markers for i in items] == [[], [], [], ["slow", "slow"]]  # a test of the tiny run is slow
