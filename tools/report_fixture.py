"""Refresh the plot stage's test fixture from the run in the workspace (not a DVC stage, ~10 s):

    dvc repro                           # the default run: data/tables, reports/report.md, reports/curves
    python tools/report_fixture.py      # copy its tables to tests/report/run_tables, describe its figures

``tests/report/test_render_run.py`` then draws the run again from those tables alone and checks that
``reports/report.md`` and ``reports/curves`` come out to the byte, and that every figure shows what
``tests/report/figures.json`` describes: titles, axis labels, legends and the numbers drawn (to 6 significant
digits), not PNG bytes, which depend on the machine's fonts; and the same of the committed studies' figures
(three-model study, sweeps, width study) drawn from their committed tables. Run it whenever the committed default run or
a study changes, and look at the diff of figures.json: it is the change in what the figures show.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import typer

ROOT = Path(__file__).resolve().parent.parent
TABLES = ROOT / "tests" / "report" / "run_tables"
FIGURES = ROOT / "tests" / "report" / "figures.json"
OPTIONAL = ("cka", "alignment")  # drawn when the run has them (alignment: each layer's share of R_γ)
WIDTH = ("spectrum", "energy", "alignment")  # the width study's tables (reports/width)
app = typer.Typer(add_completion=False)


def _number(x: float) -> float | str:
    return float(f"{x:.6g}") if math.isfinite(x) else repr(x)


def numbers(values: Iterable) -> list:
    """The values to 6 significant digits; more than 12 as their count, sum and sum of squares instead (a
    fingerprint that any changed value moves, and a short diff when one does)."""
    values = pd.Series(list(values), dtype=float)
    if len(values) > 12:
        finite = values[values.map(math.isfinite)]
        values = pd.Series([len(values), len(finite), finite.sum(), (finite**2).sum()], dtype=float)
    return [_number(float(v)) for v in values]


def _line(line) -> list:
    xs, ys = line.get_xdata(), line.get_ydata()
    return [line.get_label(), line.get_linestyle(), str(line.get_marker()), numbers(xs), numbers(ys)]


def _collection(c) -> list:
    """A scatter's points and sizes, and the vertices of the paths it draws (bands, error bars, contours)."""
    offsets = numbers(c.get_offsets().ravel()) if len(c.get_offsets()) else []
    sizes = numbers(c.get_sizes()) if hasattr(c, "get_sizes") else []
    vertices = [v for path in c.get_paths() for v in path.vertices.ravel().tolist()]
    return [type(c).__name__, c.get_label(), offsets, sizes, len(c.get_paths()), numbers(vertices)]


def _words(labels) -> list[str]:
    """Tick labels that are words (method names); numbers (plain or math text: ``$10^{-2}$``) are left
    out, they follow the data and the locator."""
    texts = [t.get_text() for t in labels]
    return [t for t in texts if t and not t.startswith("$") and not _is_number(t)]


def _is_number(text: str) -> bool:
    try:
        float(text.replace("−", "-"))
    except ValueError:
        return False
    return True


def _axes(ax) -> dict:
    legend = ax.get_legend()
    return {
        "title": ax.get_title(),
        "xlabel": ax.get_xlabel(),
        "ylabel": ax.get_ylabel(),
        "legend": [t.get_text() for t in legend.get_texts()] if legend else None,
        "legend_size": legend.get_texts()[0].get_fontsize() if legend and legend.get_texts() else None,
        "ticks": [_words(ax.get_xticklabels()), _words(ax.get_yticklabels())],
        "lines": [_line(line) for line in ax.get_lines()],
        "collections": [_collection(c) for c in ax.collections],
        "bars": [numbers([p.get_x(), p.get_width(), p.get_height()]) for p in ax.patches],
        "texts": [t.get_text() for t in ax.texts],
    }


def describe(fig: plt.Figure) -> dict:
    """What ``fig`` shows, as plain data (JSON-ready): its title and size, and per axes :func:`_axes`."""
    title = fig._suptitle.get_text() if fig._suptitle is not None else ""
    return {"suptitle": title, "size": numbers(fig.get_size_inches()), "axes": [_axes(ax) for ax in fig.axes]}


def run_tables(folder: Path = TABLES) -> dict[str, pd.DataFrame]:
    return {p.stem: pd.read_parquet(p) for p in sorted(folder.glob("*.parquet"))}


def settings() -> object:
    """The plot stage's settings for the committed params.yaml (as stages/plot.py reads them)."""
    from lmclab.pipeline.stage import load_yaml
    from lmclab.report.render import PlotSettings

    params = load_yaml(ROOT / "params.yaml")
    plot = params["plot"]
    data, arch = params["data"]["name"], params["model"]["arch"]
    return PlotSettings(dpi=plot["dpi"], band=plot["band"], title=plot["title"], data=data, arch=arch)


@contextlib.contextmanager
def closed_figures() -> Iterator[list[dict]]:
    """The descriptions of the figures closed inside (``plt.close`` watched, then restored)."""
    closed: list[dict] = []
    close = plt.close
    plt.close = lambda fig=None: closed.append(describe(fig)) or close(fig)
    try:
        yield closed
    finally:
        plt.close = close


def render_described(tables: dict[str, pd.DataFrame], out: Path) -> tuple[dict[str, Path], dict[str, dict]]:
    """:func:`lmclab.report.render.render_run` into ``out``, each figure described as it is closed."""
    from lmclab.report.render import render_run

    findings = json.loads((ROOT / "metrics" / "findings.json").read_text())
    with closed_figures() as closed:
        figures = render_run(tables, findings, out, out / "curves", settings())
    return figures, dict(zip(figures, closed, strict=True))


def described(draw) -> dict:
    """The description of the one figure ``draw()`` saves and closes."""
    with closed_figures() as closed:
        draw()
    (only,) = closed
    return only


STUDY_FIGURES = ("three_study", "sweep_lr", "sweep_weight_decay", "width", "lm")


def study_figure(name: str, out: Path) -> dict:
    """A committed study's figure (one of :data:`STUDY_FIGURES`) drawn again from its committed tables into
    ``out``, described."""
    from lmclab.report.plots import plot_width
    from lmclab.report.plots_lm import plot_lm_study
    from lmclab.report.plots_sweep import plot_sweep
    from lmclab.report.plots_three import plot_three_study

    reports = ROOT / "reports"
    if name == "three_study":
        table, edges = (pd.read_parquet(reports / "three_study" / f"{n}.parquet") for n in ("table", "edges"))
        return described(lambda: plot_three_study(table, edges, out / "three.png", dpi=120))
    if name == "lm":
        sweeps, points = (pd.read_parquet(reports / "lm" / f"{n}.parquet") for n in ("sweep", "points"))
        return described(lambda: plot_lm_study(sweeps, points, out / "lm.png", dpi=120))
    if name == "width":
        spectrum, energy, alignment = (pd.read_parquet(reports / "width" / f"{n}.parquet") for n in WIDTH)
        return described(lambda: plot_width(spectrum, energy, alignment, out / "width.png", dpi=120))
    swept = name.removeprefix("sweep_")
    sweep = pd.read_parquet(reports / "sweeps" / swept / "table.parquet")
    return described(lambda: plot_sweep(sweep, out / "sweep.png", param=f"train.{swept}", dpi=120))


@app.command()
def main(tables: Path = ROOT / "data" / "tables") -> None:
    from lmclab.report.render import NEEDED

    missing = [t for t in NEEDED if not (tables / f"{t}.parquet").is_file()]
    if missing:
        raise SystemExit(f"error: {tables}: no {', '.join(missing)} (run dvc repro first)")
    shutil.rmtree(TABLES, ignore_errors=True)
    TABLES.mkdir(parents=True)
    for name in (*NEEDED, *OPTIONAL):
        if (tables / f"{name}.parquet").is_file():
            shutil.copy2(tables / f"{name}.parquet", TABLES / f"{name}.parquet")
    with tempfile.TemporaryDirectory() as tmp:
        _, figures = render_described(run_tables(), Path(tmp))
        figures |= {f"study {name}": study_figure(name, Path(tmp)) for name in STUDY_FIGURES}
    FIGURES.write_text(json.dumps(figures, indent=1, ensure_ascii=False) + "\n")
    print(f"{TABLES.relative_to(ROOT)}: {len(list(TABLES.iterdir()))} tables; {FIGURES.relative_to(ROOT)} written")


if __name__ == "__main__":
    app()
