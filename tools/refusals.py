"""Which refusals of the library no test reaches: every ``raise`` statement in ``src/lmclab`` whose line a
coverage run of the suite never executed:

    coverage run -m pytest            # the suite, recording lines (make test's tests; pyproject.toml's settings)
    python tools/refusals.py          # combines the data files; reports/mutation/refusals.json and a summary
    python tools/refusals.py --append # the same, keeping the lines an earlier combined run recorded

Without ``--append`` the new data files replace an earlier combined ``.coverage`` (as ``coverage combine``
does): after a partial run of the suite, ``--append`` adds its lines to the full run's.

Coverage follows the programs the tests start (``patch = subprocess`` in pyproject.toml): the ``lmclab``
command and the DVC stages, including stages run in a temporary copy of the repository, count.
``docs/testing.md`` says how the figure is used.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import typer

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "lmclab"
OUT = ROOT / "reports" / "mutation" / "refusals.json"
app = typer.Typer(add_completion=False)


def raise_lines(path: Path) -> list[int]:
    """The line of every ``raise`` statement in ``path`` (a bare re-raise included)."""
    tree = ast.parse(path.read_text(), str(path))
    return sorted(node.lineno for node in ast.walk(tree) if isinstance(node, ast.Raise))


def unreached(executed: dict[str, set[int]]) -> tuple[int, dict[str, list[int]]]:
    """The number of ``raise`` statements in the library, and per file (relative to the repository) those
    whose line is not in ``executed`` (absolute path → executed lines)."""
    total, out = 0, {}
    for path in sorted(SRC.rglob("*.py")):
        lines = raise_lines(path)
        total += len(lines)
        missed = [n for n in lines if n not in executed.get(str(path.resolve()), set())]
        if missed:
            out[path.relative_to(ROOT).as_posix()] = missed
    return total, out


@app.command()
def main(
    data: Path = ROOT / ".coverage",
    append: bool = typer.Option(False, help="keep the lines already combined in DATA (coverage combine --append)"),
    out: Path = OUT,
) -> None:
    import coverage

    if any(data.parent.glob(data.name + ".*")):  # one file per process: merge them into ``data``
        merged = coverage.Coverage(data_file=str(data), config_file=str(ROOT / "pyproject.toml"))
        if append and data.is_file():
            merged.load()  # as the command line's --append: combine adds to what was loaded
        merged.combine()
        merged.save()
    if not data.is_file():
        raise SystemExit(f"error: {data}: no coverage data (run `coverage run -m pytest` first)")
    recorded = coverage.CoverageData(basename=str(data))
    recorded.read()
    executed = {str(Path(f).resolve()): set(recorded.lines(f) or ()) for f in recorded.measured_files()}
    total, missed = unreached(executed)
    count = sum(map(len, missed.values()))
    out.write_text(json.dumps({"raise_statements": total, "unreached": count, "files": missed}, indent=1) + "\n")
    where = out.relative_to(ROOT) if out.is_relative_to(ROOT) else out
    print(f"{total - count} of {total} raise statements reached by the suite; {count} unreached: {where}")


if __name__ == "__main__":
    app()
