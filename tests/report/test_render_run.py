"""The plot stage's work, drawn again from the tables of the committed default run (``tests/report/run_tables``,
copied from ``data/tables`` by ``tools/report_fixture.py`` whenever the committed run changes): ``report.md``
and the plot data are the committed ones to the byte, and every figure shows what ``tests/report/figures.json``
says (titles, labels, legends and the numbers drawn, to 6 significant digits)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from dvc_repo import ROOT
from report_fixture import FIGURES, STUDY_FIGURES, render_described, run_tables, study_figure

from lmclab.report.render import NEEDED


@pytest.fixture
def rendered(tmp_path):
    """The run drawn again, for each test that reads it (mutation testing sees which test draws what)."""
    figures, described = render_described(run_tables(), tmp_path)
    return tmp_path, figures, described


def test_the_fixture_holds_every_table_a_run_is_drawn_from() -> None:
    assert set(NEEDED) <= set(run_tables())


def test_the_report_and_the_plot_data_drawn_again_are_the_committed_runs(rendered) -> None:
    out, figures, _ = rendered
    assert (out / "report.md").read_text() == (ROOT / "reports" / "report.md").read_text()
    committed = sorted(p.name for p in (ROOT / "reports" / "curves").glob("*.csv"))
    assert sorted(p.name for p in (out / "curves").glob("*.csv")) == committed
    for name in committed:
        assert (out / "curves" / name).read_text() == (ROOT / "reports" / "curves" / name).read_text(), name
    assert sorted(p.name for p in (out / "figures").iterdir()) == sorted(p.name for p in figures.values())


def test_every_figure_of_the_run_shows_its_description(rendered) -> None:
    _, _, described = rendered
    assert plt.get_fignums() == []  # every figure closed once saved
    expected = {k: v for k, v in json.loads(FIGURES.read_text()).items() if not k.startswith("study ")}
    assert sorted(described) == sorted(expected)
    for name, description in described.items():
        assert json.loads(json.dumps(description, ensure_ascii=False)) == expected[name], name


@pytest.mark.parametrize("name", STUDY_FIGURES)
def test_each_study_figure_drawn_alone_shows_its_description(tmp_path, name) -> None:
    """The committed studies' figures (three-model study, sweeps, width), each drawn again in its own test
    from its committed tables (a figure drawn once for several tests would be seen by the first alone)."""
    figures = json.loads(FIGURES.read_text())
    assert sorted(k for k in figures if k.startswith("study ")) == sorted(f"study {n}" for n in STUDY_FIGURES)
    described = study_figure(name, tmp_path)
    assert json.loads(json.dumps(described, ensure_ascii=False)) == figures[f"study {name}"]


def test_the_summaries_and_findings_are_the_committed_runs() -> None:
    """The summarize stage's JSON from the same tables: headline metrics, the paper's findings checked on the
    run (with the committed three-model study's note), and the detail summaries (the machine aside)."""
    from lmclab.pipeline.stage import load_yaml
    from lmclab.report.run_summary import RunSettings, run_summaries
    from lmclab.studies.three_study import study_summary

    params = load_yaml(ROOT / "params.yaml")
    run = RunSettings(
        pairs=params["permute"]["pairs"],
        methods=params["permute"]["methods"],
        seeds=params["train"]["seeds"],
        triples=params["three"]["triples"],
        three_methods=params["three"]["methods"],
    )
    study = study_summary(pd.read_parquet(ROOT / "reports" / "three_study" / "table.parquet"))
    summaries = run_summaries(run_tables(), run, study)
    for name, folder in (("headline", "metrics"), ("findings", "metrics"), ("summary", "reports/detail")):
        assert _json(summaries[name]) == json.loads((ROOT / folder / f"{name}.json").read_text()), name
    for name in ("three_models", "merge_many"):
        assert _json(summaries[name]) == json.loads((ROOT / "reports" / "detail" / f"{name}.json").read_text()), name


def _json(value):
    """``value`` as the stage writes it and reads back (NaN and tuples as JSON has them)."""
    from lmclab.core.atomic import write_json

    with tempfile.TemporaryDirectory() as tmp:
        write_json(Path(tmp) / "x.json", value)
        return json.loads((Path(tmp) / "x.json").read_text())


def test_the_interpolation_band_is_the_range_over_pairs_when_asked(tmp_path, monkeypatch) -> None:
    """``band: range``: the title says so, and the naive method's band on the first panel runs from its
    lowest to its highest pair's train loss over λ (a ±std band would not reach either); every band is
    translucent, so the lines and the other methods' bands show through it."""
    from lmclab.report.plots import plot_interpolation

    curves = run_tables()["curves"]
    figures = []
    close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: figures.append(fig) or close(fig))
    plot_interpolation(curves, tmp_path / "i.png", band="range")
    (fig,) = figures
    assert fig._suptitle.get_text() == f"Linear interpolation, mean ± range over {curves['pair'].nunique()} pair(s)"
    naive = curves[(curves["split"] == "train") & (curves["method"] == "identity")]
    if "repair" in naive:
        naive = naive[~naive["repair"].astype(bool)]
    ys = fig.axes[0].collections[0].get_paths()[0].vertices[:, 1]
    assert ys.min() == pytest.approx(naive["loss"].min()) and ys.max() == pytest.approx(naive["loss"].max())
    assert {band.get_alpha() for ax in fig.axes for band in ax.collections} == {0.2}


def test_table3_without_an_r_column_has_as_many_separators_as_headers() -> None:
    from lmclab.report.three_models import table3

    edges = run_tables()["three_edges"]
    plain = edges[[c for c in edges.columns if not c.startswith("R_")]]
    for frame, columns in ((plain, 9), (edges, 12)):
        header, separator, *rows = table3(frame).splitlines()
        assert header.count("|") - 1 == separator.count("|") - 1 == columns
        assert all(row.count("|") - 1 == columns for row in rows if row.startswith("| "))


def test_a_merge_without_accuracy_shows_its_loss_alone() -> None:
    """A reconstruction model (MAE) has no accuracy: its merged cells show the loss to 4 decimals."""
    from lmclab.report.many_models import _merged_cell, merged_test

    evaluation = run_tables()["merge_many"]
    method = evaluation["method"].iloc[0]
    acc, loss = merged_test(evaluation, method, False)
    assert acc == acc and _merged_cell(evaluation, method) == f"{acc:.2f} ({loss:.3f})"
    assert _merged_cell(evaluation.assign(acc=float("nan")), method) == f"{loss:.4f}"


def test_a_run_without_findings_has_the_report_without_their_section(tmp_path) -> None:
    from report_fixture import settings

    from lmclab.report.paper_tables import findings_section
    from lmclab.report.render import render_run

    findings = json.loads((ROOT / "metrics" / "findings.json").read_text())
    render_run(run_tables(), {}, tmp_path, tmp_path / "curves", settings())
    committed = (ROOT / "reports" / "report.md").read_text()
    assert findings_section(findings) in committed
    assert (tmp_path / "report.md").read_text() == committed.replace(findings_section(findings), "")


def test_a_run_with_barriers_by_family_has_their_section(tmp_path) -> None:
    from report_fixture import settings

    from lmclab.report.render import render_run

    tables = run_tables()
    methods = list(dict.fromkeys(tables["pairs"]["method"]))
    rows = [  # two pairs; the second method has no row for `fc1` (it moves nowhere there)
        {"pair": p, "method": m, "family": f, "alone": a, "all_but": b}
        for p, shift in (("seed0-seed1", 0.0), ("seed2-seed3", 0.2))
        for m, f, a, b in (
            (methods[0], "(all)", 1.0 + shift, 1.0 + shift),
            (methods[0], "fc1", 0.2 + shift, 0.5),
            (methods[1], "(all)", 0.4, 0.4),
        )
    ]
    render_run({**tables, "families": pd.DataFrame(rows)}, {}, tmp_path, tmp_path / "curves", settings())
    report = (tmp_path / "report.md").read_text()
    section = report[report.index("## Where the barrier is: by family of layers") :]
    lines = [line for line in section.splitlines() if line.startswith("| `")]
    assert lines == [
        "| `(all)` | 1.100 ± 0.141 / 1.100 ± 0.141 | 0.400 ± 0.000 / 0.400 ± 0.000 |",
        "| `fc1` | 0.300 ± 0.141 / 0.500 ± 0.000 | — |",
    ]
    assert "## Where the barrier is" not in (ROOT / "reports" / "report.md").read_text()  # not asked there


@pytest.mark.parametrize(("fc1", "said"), [(0.05, "5.0 %"), (0.2, "20.0 %")])
def test_the_verdict_on_families_reads_the_largest_share_of_a_methods_whole_barrier(fc1, said) -> None:
    from lmclab.report.families import verdict

    rows = [  # wm: whole 1.0; am: whole 0.5, its q alone 0.04 (8 %); naive: whole ≤ 0, left out
        ("wm", "(all)", 1.0), ("wm", "fc1", fc1), ("wm", "q", -0.3),
        ("am", "(all)", 0.5), ("am", "q", 0.04),
        ("identity", "(all)", -0.1), ("identity", "q", 0.5),
    ]  # fmt: skip
    families = pd.DataFrame([{"method": m, "family": f, "alone": a, "pair": "p"} for m, f, a in rows])
    line = verdict(families, str)
    assert verdict(families[families["method"] == "identity"], str) == "No method has a positive whole barrier."
    head = "The largest barrier of one family moving alone is "
    if fc1 < 0.08:  # am's 8 % is then the largest share, under a tenth
        interplay = ": no family carries the barrier on its own, it is the families' interplay."
        assert line == head + f"8.0 % of its method's whole barrier (`q` under am: 0.040 of 0.500){interplay}"
    else:
        assert line == head + f"{said} of its method's whole barrier (`fc1` under wm: 0.200 of 1.000)."
