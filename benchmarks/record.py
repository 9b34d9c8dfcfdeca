"""One shape for every benchmark's result, written by :func:`record`:

    {"runs": [{"command": …, "commit": …, "date": …, "machine": {…}, <the run's settings>}, …],
     "rows": [{"run": 0, <one measurement>}, …],
     <anything else the benchmark keeps beside its rows (a check, the settings it compared)>}

``command`` is the benchmark's argv, shell-quoted (``python benchmarks/bench_x.py --flag …``), ``commit``
and ``machine`` name the code and the computer as ``tools/mutation_report.py`` and
``lmclab.core.device.describe_machine`` name them for every record of the project, and each row names
its run, so that a file appended to over several runs (``--append``) keeps which run measured what.
Results that pages quote go to ``benchmarks/results/`` (committed, every file there); the others go to
``benchmarks/scratch/`` (git-ignored).
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"  # committed: the measurements the docs quote
SCRATCH = ROOT / "benchmarks" / "scratch"  # git-ignored: every other run's output


def command(argv: list[str] | None = None) -> str:
    """``argv`` (this process's by default) as the shell line that reruns it from the repository's root."""
    argv = list(sys.argv if argv is None else argv)
    script = Path(argv[0])
    if script.is_absolute() and script.is_relative_to(ROOT):
        argv[0] = str(script.relative_to(ROOT))
    return shlex.join(["python", *argv])


def this_run(**settings: Any) -> dict:
    """The run's command, commit, date (UTC, to the minute) and machine, then ``settings``."""
    sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tools")]
    from mutation_report import commit

    from lmclab.core.device import describe_machine

    date = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return {"command": command(), "commit": commit(ROOT), "date": date, "machine": describe_machine(), **settings}


def record(
    out: Path,
    rows: list[dict],
    *,
    run: dict | None = None,
    keep: Callable[[dict], bool] | None = None,
    **extras: Any,
) -> dict:
    """Write ``rows`` measured by ``run`` (:func:`this_run` by default) to ``out`` in the one shape, with
    ``extras`` beside them; with ``keep``, the rows of ``out``'s earlier runs for which ``keep(row)`` is true
    stay, each with its own run. Returns what was written."""
    run = this_run() if run is None else run
    runs: list[dict] = []
    kept: list[dict] = []
    if keep is not None and out.is_file():
        earlier = json.loads(out.read_text())
        for row in earlier["rows"]:
            if keep(row):
                source = earlier["runs"][row["run"]]
                runs += [source] if source not in runs else []
                kept.append({**row, "run": runs.index(source)})
    runs.append(run)  # its own entry even if an earlier run reads the same (the same minute, command, commit)
    result = {"runs": runs, "rows": kept + [{**r, "run": len(runs) - 1} for r in rows], **extras}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    return result
