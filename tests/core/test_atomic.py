"""lmclab.core.atomic: an output file is either the old one or the complete new one, never a part."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmclab.core.atomic import atomic_path


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
