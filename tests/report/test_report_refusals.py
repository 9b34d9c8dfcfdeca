"""Refusals of the report that the rest of the suite does not reach: a run drawn from tables that lack
one the figures or the report need is one line naming every missing table, before anything is written;
with every needed table (and without the optional ``cka``) the drawing starts."""

from __future__ import annotations

import pandas as pd
import pytest

from lmclab.report import render
from lmclab.report.render import NEEDED, PlotSettings, render_run


class Drawing(Exception):
    """Raised where the plot data is gathered: the tables were accepted."""


def test_a_run_needs_every_table_its_figures_and_report_are_drawn_from(tmp_path, monkeypatch) -> None:
    tables = {name: pd.DataFrame({"x": [1.0]}) for name in NEEDED}
    out, curves = tmp_path / "out", tmp_path / "curves"
    for given in ({}, {"cka": tables["pairs"]}):  # the optional table stands for none of the needed ones
        with pytest.raises(ValueError, match=r"^tables: missing " + ", ".join(sorted(NEEDED)) + "$"):
            render_run(given, {}, out, curves, PlotSettings())
    for name in NEEDED:
        with pytest.raises(ValueError, match=rf"^tables: missing {name}$"):
            render_run({k: v for k, v in tables.items() if k != name}, {}, out, curves, PlotSettings(dpi=50))
    assert list(tmp_path.iterdir()) == []  # refused before anything is written

    def gathered(series):
        raise Drawing(sorted(series))

    monkeypatch.setattr(render, "plot_tables", gathered)
    with pytest.raises(Drawing) as drawing:
        render_run(tables, {}, out, curves, PlotSettings(dpi=50))
    assert drawing.value.args == (["curves", "history", "search_curves", "search_objective"],)
