"""What the suite costs, recorded by the run itself (a pytest plugin, loaded by ``tests/conftest.py``).

``pytest --record-durations TIER`` (``make durations`` runs both tiers with it) writes the tier's wall
time, test count, command, commit, date and machine into ``tests/durations.json``, per number of worker
processes (``-n``; 1 without xdist), so one and two workers can be compared; the ``full``
tier also writes every test's seconds (setup + call + teardown) and whether the fast tier runs it (marked
neither ``slow`` nor ``extras``), which
``tests/meta/test_suite_budget.py`` holds against the budgets of ``tools/test_durations.py``. Under
pytest-xdist the controller records: the workers' reports reach it through this same hook. The same record
orders the test files for the workers (:func:`pytest_collection_modifyitems`)."""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
import time
from pathlib import Path

import pytest
from mutation_report import commit, machine  # tools/: how every record there names them

ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / "tests" / "durations.json"
TIERS = ("fast", "full")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--record-durations",
        choices=TIERS,
        default=None,
        help="write this tier's wall time (and, for full, every test's seconds) into tests/durations.json",
    )


class Recorder:
    def __init__(self, tier: str) -> None:
        self.tier, self.start = tier, time.monotonic()
        self.seconds: dict[str, float] = {}
        self.markers: dict[str, str] = {}  # nodeid -> "slow" or "extras": left out of the fast tier
        self.outcomes: dict[str, str] = {}

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration
        for marker in ("slow", "extras"):
            if marker in report.keywords:
                self.markers.setdefault(report.nodeid, marker)
        if report.when == "call" or report.outcome != "passed":
            self.outcomes.setdefault(report.nodeid, report.outcome)

    @pytest.hookimpl
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if exitstatus not in (0, 5):
            print(f"\n--record-durations: the {self.tier} tier failed (exit {exitstatus}); nothing recorded")
            return
        record = json.loads(RECORD.read_text()) if RECORD.is_file() else {}
        workers = getattr(session.config.option, "numprocesses", None) or 1  # -n 0: one process, no xdist
        record.setdefault("tiers", {}).setdefault(self.tier, {})[str(workers)] = {
            "seconds": round(time.monotonic() - self.start, 1),
            "tests": sum(o == "passed" for o in self.outcomes.values()),
            "skipped": sum(o == "skipped" for o in self.outcomes.values()),
            "workers": workers,
            "command": shlex.join(["pytest", *sys.argv[1:]]),
            "commit": commit(ROOT),
            "date": time.strftime("%Y-%m-%d"),
            "machine": machine(),
        }
        if self.tier == "full":
            record["per_test"] = {
                "workers": workers,
                "tests": {
                    nodeid: {"seconds": round(s, 2), "fast": nodeid not in self.markers}
                    for nodeid, s in sorted(self.seconds.items())
                },
            }
        RECORD.write_text(dump(record))


def dump(record: dict) -> str:
    """The record as JSON with one line per test (a diff of two records then reads test by test)."""
    text = json.dumps(record, indent=1)
    one_line = r'\{\n\s+"seconds": ([^,]+),\n\s+"fast": (true|false)\n\s+\}'
    return re.sub(one_line, r'{"seconds": \1, "fast": \2}', text) + "\n"


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that restores the tiny run (the ``tiny_run`` fixture: a real ``dvc repro``) is marked ``slow``,
    so the fast tier never starts one. Under pytest-xdist, the test files longest in the record come first,
    so that the short ones fill the end and both workers finish together (longest processing time first);
    files the record lacks come last. Every worker collects the same order, as xdist requires; within a
    file the order is kept."""
    for item in items:
        if "tiny_run" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
    if not os.environ.get("PYTEST_XDIST_WORKER") or not RECORD.is_file():
        return
    cost: dict[str, float] = {}
    for nodeid, test in json.loads(RECORD.read_text()).get("per_test", {}).get("tests", {}).items():
        cost[nodeid.split("::")[0]] = cost.get(nodeid.split("::")[0], 0.0) + test["seconds"]
    rank = {item: -cost.get(item.nodeid.split("::")[0], 0.0) for item in items}
    items.sort(key=rank.__getitem__)  # stable: a file's tests keep their order


def pytest_configure(config: pytest.Config) -> None:
    tier = config.getoption("--record-durations")
    if tier and not hasattr(config, "workerinput"):  # the controller (or the only process) records
        config.pluginmanager.register(Recorder(tier), "suite-cost-recorder")
