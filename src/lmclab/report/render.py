"""Every figure of one run, its ``report.md`` and the DVC plot data (CSV series that ``dvc plots`` draws,
:mod:`lmclab.report.plot_data`), from the summarize stage's tables and findings only (never recomputes):
the plot stage's work as one call, :func:`render_run`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from lmclab.report.cka import plot_cka
from lmclab.report.document import write_report
from lmclab.report.many_models import plot_many
from lmclab.report.plot_data import plot_tables, write_plot_tables
from lmclab.report.plots import (
    plot_alignment,
    plot_energy,
    plot_interpolation,
    plot_output_scale,
    plot_search_curves,
    plot_spectra,
    plot_taylor,
    plot_training,
)
from lmclab.report.three_models import plot_landscape, plot_three_barriers

NEEDED = (  # the summarize stage's tables a run's figures and report are drawn from
    *("curves", "pairs", "history", "three_edges", "merge_many", "merge_many_methods", "merge_many_trace"),
    *("landscape", "search_curves", "search_objective", "taylor", "spectrum", "output_scale", "energy"),
    *("table1", "theorem42"),
)


@dataclass(frozen=True)
class PlotSettings:
    """How a run is drawn: figure ``dpi``, the ``band`` around the mean over pairs (``std`` or ``range``),
    the report's ``title``, and the dataset and architecture names that pick the paper's rows."""

    dpi: int = 120
    band: str = "std"
    title: str = ""
    data: str = ""
    arch: str = ""


def render_run(
    tables: Mapping[str, pd.DataFrame], findings: dict, out: Path, curves: Path, settings: PlotSettings
) -> dict[str, Path]:
    """Draw the figures into ``out/figures``, write ``out/report.md`` and the plot data into ``curves``;
    ``tables``: the summarize stage's tables by name (``cka``, ``alignment`` and ``families`` optional). Returns
    the figures by name."""
    missing = sorted(set(NEEDED) - set(tables))
    if missing:
        raise ValueError(f"tables: missing {', '.join(missing)}")
    plot_series = ("curves", "history", "search_curves", "search_objective")
    write_plot_tables(plot_tables({name: tables[name] for name in plot_series}), curves)
    figures = draw_figures(tables, out / "figures", settings.dpi, settings.band)
    pairs = tables["pairs"]
    write_report(
        out / "report.md",
        title=settings.title,
        pairs=pairs,
        history=tables["history"],
        methods=list(dict.fromkeys(pairs["method"])),
        figures=figures,
        t1=tables["table1"],
        bounds=tables["theorem42"],
        layers=tables.get("alignment"),
        families=tables.get("families"),
        edges=tables["three_edges"],
        evaluation=tables["merge_many"],
        many_methods=tables["merge_many_methods"],
        data=settings.data,
        arch=settings.arch,
        findings=findings,
    )
    return figures


def draw_figures(tables: Mapping[str, pd.DataFrame], folder: Path, dpi: int, band: str) -> dict[str, Path]:
    """Every figure of the run as ``folder/<name>.png``, by name (the report's order)."""
    fig = lambda name: folder / f"{name}.png"  # noqa: E731
    landscape, pairs = tables["landscape"], tables["pairs"]
    figures = {
        "interpolation": plot_interpolation(tables["curves"], fig("interpolation"), dpi=dpi, band=band),
        "training": plot_training(tables["history"], fig("training"), dpi=dpi),
        "three": plot_three_barriers(tables["three_edges"], fig("three_barriers"), dpi=dpi),
        "landscape": plot_landscape(
            landscape,
            fig("landscape"),
            dpi=dpi,
            quantity="acc" if landscape["acc"].notna().any() else "loss",  # a reconstruction model has no accuracy
        ),
        "merge_many": plot_many(tables["merge_many_trace"], tables["merge_many"], fig("merge_many"), dpi=dpi),
        "alignment": plot_alignment(pairs, fig("alignment"), dpi=dpi),
        "taylor": plot_taylor(tables["taylor"], fig("taylor"), dpi=dpi),
        "spectra": plot_spectra(tables["spectrum"], fig("spectra"), dpi=dpi),
        "output_scale": plot_output_scale(tables["output_scale"], fig("output_scale"), dpi=dpi),
        "energy": plot_energy(tables["energy"], fig("energy"), dpi=dpi),
    }
    if "cka" in tables:
        figures["cka"] = plot_cka(tables["cka"], fig("cka"), methods=list(dict.fromkeys(pairs["method"])), dpi=dpi)
    if len(tables["search_curves"]):
        figures["search_curves"] = plot_search_curves(tables["search_curves"], fig("search_curves"), dpi=dpi)
    return figures
