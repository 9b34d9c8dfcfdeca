"""lmclab.core.atomic: an output file is either the old one or the complete new one, never a part."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from lmclab.core.atomic import atomic_path, write_json, write_table, write_text


def test_a_writer_that_raises_leaves_the_old_file_and_no_temporary_file(tmp_path: Path) -> None:
    out = tmp_path / "tables" / "curve.parquet"
    with atomic_path(out) as tmp:
        tmp.write_text("old")
    with pytest.raises(RuntimeError, match="interrupted"), atomic_path(out) as tmp:
        tmp.write_text("half of the ne")
        raise RuntimeError("interrupted")
    assert out.read_text() == "old" and [p.name for p in out.parent.iterdir()] == ["curve.parquet"]


def test_nothing_appears_at_the_path_before_the_writer_finishes(tmp_path: Path) -> None:
    out = tmp_path / "new" / "figure.png"
    with atomic_path(out) as tmp:
        tmp.write_text("partial")
        assert not out.exists() and tmp.parent == out.parent and tmp.suffix == ".png"
    assert out.read_text() == "partial" and [p.name for p in out.parent.iterdir()] == ["figure.png"]


def test_write_json_writes_indented_json_with_a_final_newline(tmp_path: Path) -> None:
    out = write_json(tmp_path / "a" / "summary.json", {"seed": 1, "B": [0.5, None]})
    assert out == tmp_path / "a" / "summary.json"
    assert out.read_text() == json.dumps({"seed": 1, "B": [0.5, None]}, indent=2) + "\n"


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_write_table_writes_parquet_or_csv_by_suffix_without_the_index(tmp_path: Path, suffix: str) -> None:
    frame = pd.DataFrame({"lam": [0.0, 0.5, 1.0], "loss": [0.1, 0.123456789, 0.2]}, index=[7, 8, 9])
    out = write_table(tmp_path / f"curve{suffix}", frame)
    back = pd.read_parquet(out) if suffix == ".parquet" else pd.read_csv(out)
    pd.testing.assert_frame_equal(back, frame.reset_index(drop=True))


def test_write_table_formats_csv_floats_when_asked_and_refuses_other_suffixes(tmp_path: Path) -> None:
    frame = pd.DataFrame({"loss": [0.123456789]})
    assert write_table(tmp_path / "c.csv", frame, float_format="%.6g").read_text() == "loss\n0.123457\n"
    with pytest.raises(ValueError, match=r"^path must end in \.parquet or \.csv, got '.*c\.json'$"):
        write_table(tmp_path / "c.json", frame)
    with pytest.raises(ValueError, match=r"^float_format applies to a \.csv path"):
        write_table(tmp_path / "c.parquet", frame, float_format="%.6g")


class _Interrupted(RuntimeError):
    pass


class _HalfTable:
    """A frame whose Parquet writer dies after writing part of the file."""

    def to_parquet(self, path: Path, index: bool) -> None:
        Path(path).write_bytes(b"PAR1 half")
        raise _Interrupted


def _half_write_text(self: Path, text: str, *args, **kwargs) -> int:
    with open(self, "w") as f:
        f.write(text[: len(text) // 2])
    raise _Interrupted


@pytest.mark.parametrize("helper", ["write_json", "write_text", "write_table"])
def test_a_helper_interrupted_mid_write_leaves_the_old_file_and_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, helper: str
) -> None:
    out = tmp_path / {"write_json": "out.json", "write_text": "out.md", "write_table": "out.parquet"}[helper]
    out.write_text("old")
    with pytest.raises(_Interrupted):
        if helper == "write_table":
            write_table(out, _HalfTable())
        else:
            monkeypatch.setattr(Path, "write_text", _half_write_text)
            (write_json if helper == "write_json" else write_text)(out, {"new": 1} if helper == "write_json" else "new")
    monkeypatch.undo()
    assert out.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == [out.name]
