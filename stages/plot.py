"""Stage plot: figures, ``report.md`` and the DVC plot data (``--curves``: CSV files that
``dvc plots show``/``diff`` draw, ``lmclab.report.plot_data``) from the saved tables and ``findings.json``
only (never recomputes); ``data.name`` and ``model.arch`` pick the paper's rows. ~3 s."""

from __future__ import annotations

from pathlib import Path

import typer
from _repo_src import DVC_YAML  # first: this repository's src/ on sys.path

from lmclab.pipeline.stage import one_line_errors, run_warm, stage_params

app = typer.Typer(add_completion=False)


@app.command()
@one_line_errors
def main(
    tables_dir: Path = typer.Option(...),
    findings: Path = typer.Option(...),
    out: Path = typer.Option(...),
    curves: Path = typer.Option(...),
    params: Path = Path("params.yaml"),
) -> None:
    import json

    import pandas as pd

    from lmclab.report.document import write_report
    from lmclab.report.many_models import plot_many
    from lmclab.report.plot_data import plot_tables, write_plot_tables
    from lmclab.report.plots import (
        plot_alignment,
        plot_energy,
        plot_interpolation,
        plot_landscape,
        plot_output_scale,
        plot_search_curves,
        plot_spectra,
        plot_taylor,
        plot_three_barriers,
        plot_training,
    )
    from lmclab.report.plots_cka import plot_cka

    read_params = stage_params("plot", params, dvc_yaml=DVC_YAML)
    opts = read_params("plot")
    curves_table = pd.read_parquet(tables_dir / "curves.parquet")
    pairs = pd.read_parquet(tables_dir / "pairs.parquet")
    history = pd.read_parquet(tables_dir / "history.parquet")
    edges = pd.read_parquet(tables_dir / "three_edges.parquet")
    evaluation = pd.read_parquet(tables_dir / "merge_many.parquet")
    landscape = pd.read_parquet(tables_dir / "landscape.parquet")
    figures = {
        "interpolation": plot_interpolation(
            curves_table, out / "figures" / "interpolation.png", dpi=opts["dpi"], band=opts["band"]
        ),
        "training": plot_training(history, out / "figures" / "training.png", dpi=opts["dpi"]),
        "three": plot_three_barriers(edges, out / "figures" / "three_barriers.png", dpi=opts["dpi"]),
        "landscape": plot_landscape(
            landscape,
            out / "figures" / "landscape.png",
            dpi=opts["dpi"],
            quantity="acc" if landscape["acc"].notna().any() else "loss",  # a reconstruction model has no accuracy
        ),
        "merge_many": plot_many(
            pd.read_parquet(tables_dir / "merge_many_trace.parquet"),
            evaluation,
            out / "figures" / "merge_many.png",
            dpi=opts["dpi"],
        ),
    }
    read = lambda name: pd.read_parquet(tables_dir / f"{name}.parquet")  # noqa: E731
    write_plot_tables(
        plot_tables(
            {
                "curves": curves_table,
                "history": history,
                "search_curves": read("search_curves"),
                "search_objective": read("search_objective"),
            }
        ),
        curves,
    )
    fig = lambda name: out / "figures" / f"{name}.png"  # noqa: E731
    figures.update(
        alignment=plot_alignment(pairs, fig("alignment"), dpi=opts["dpi"]),
        taylor=plot_taylor(read("taylor"), fig("taylor"), dpi=opts["dpi"]),
        spectra=plot_spectra(read("spectrum"), fig("spectra"), dpi=opts["dpi"]),
        output_scale=plot_output_scale(read("output_scale"), fig("output_scale"), dpi=opts["dpi"]),
        energy=plot_energy(read("energy"), fig("energy"), dpi=opts["dpi"]),
    )
    if (tables_dir / "cka.parquet").is_file():
        figures["cka"] = plot_cka(
            read("cka"), fig("cka"), methods=list(dict.fromkeys(pairs["method"])), dpi=opts["dpi"]
        )
    if len(frame := read("search_curves")):
        figures["search_curves"] = plot_search_curves(frame, fig("search_curves"), dpi=opts["dpi"])
    write_report(
        out / "report.md",
        title=opts["title"],
        pairs=pairs,
        history=history,
        methods=list(dict.fromkeys(pairs["method"])),
        figures=figures,
        t1=read("table1"),
        bounds=read("theorem42"),
        edges=edges,
        evaluation=evaluation,
        many_methods=read("merge_many_methods"),
        data=read_params("data.name"),
        arch=read_params("model.arch"),
        findings=json.loads(findings.read_text()),
    )


if __name__ == "__main__":
    run_warm(app)
