"""tools/refusals.py combines the suite's coverage data files: replacing an earlier combined file, or adding to it
with ``--append``, and counts the library's ``raise`` lines the data never reached."""

from __future__ import annotations

import json

import coverage
from dvc_repo import ROOT
from typer.testing import CliRunner

CORPUS = ROOT / "src" / "lmclab" / "core" / "corpus.py"


def record(path, lines: list[int]) -> None:
    data = coverage.CoverageData(basename=str(path))
    data.add_lines({str(CORPUS): lines})
    data.write()


def unreached_in_corpus(out) -> list[int]:
    return json.loads(out.read_text())["files"].get("src/lmclab/core/corpus.py", [])


def test_new_data_files_replace_or_append_to_the_combined_file(tmp_path) -> None:
    from refusals import app, raise_lines

    raises = raise_lines(CORPUS)
    data, out = tmp_path / ".coverage", tmp_path / "refusals.json"
    record(data, raises[:2])  # an earlier combined run reached the first two refusals
    record(tmp_path / ".coverage.host.1", raises[2:3])  # a new partial run, the third
    result = CliRunner().invoke(app, ["--data", str(data), "--append", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert unreached_in_corpus(out) == raises[3:]
    record(tmp_path / ".coverage.host.2", raises[3:4])  # without --append only the new file's lines count
    assert CliRunner().invoke(app, ["--data", str(data), "--out", str(out)]).exit_code == 0
    assert unreached_in_corpus(out) == [n for n in raises if n != raises[3]]
    assert json.loads(out.read_text())["raise_statements"] == sum(
        len(raise_lines(p)) for p in (ROOT / "src" / "lmclab").rglob("*.py")
    )
