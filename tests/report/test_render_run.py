"""The plot stage's work, drawn again from the tables of the committed default run (``tests/report/run_tables``,
copied from ``data/tables`` by ``tools/report_fixture.py`` whenever the committed run changes): ``report.md``
and the plot data are the committed ones to the byte, and every figure shows what ``tests/report/figures.json``
says (titles, labels, legends and the numbers drawn, to 6 significant digits)."""

from __future__ import annotations

import json

import matplotlib.pyplot as plt
import pytest
from dvc_repo import ROOT
from report_fixture import FIGURES, render_described, run_tables

from lmclab.report.render import NEEDED


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    out = tmp_path_factory.mktemp("rendered")
    figures, described = render_described(run_tables(), out)
    return out, figures, described


def test_the_fixture_holds_every_table_a_run_is_drawn_from() -> None:
    assert set(NEEDED) <= set(run_tables())


def test_the_report_and_the_plot_data_are_the_committed_runs(rendered) -> None:
    out, figures, _ = rendered
    assert (out / "report.md").read_text() == (ROOT / "reports" / "report.md").read_text()
    committed = sorted(p.name for p in (ROOT / "reports" / "curves").glob("*.csv"))
    assert sorted(p.name for p in (out / "curves").glob("*.csv")) == committed
    for name in committed:
        assert (out / "curves" / name).read_text() == (ROOT / "reports" / "curves" / name).read_text(), name
    assert sorted(p.name for p in (out / "figures").iterdir()) == sorted(p.name for p in figures.values())


def test_every_figure_shows_what_its_description_says(rendered) -> None:
    _, _, described = rendered
    assert plt.get_fignums() == []  # every figure closed once saved
    expected = json.loads(FIGURES.read_text())
    assert sorted(described) == sorted(expected)
    for name, description in described.items():
        assert json.loads(json.dumps(description, ensure_ascii=False)) == expected[name], name
