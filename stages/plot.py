"""Stage plot: figures and ``report.md`` from the saved tables only (never recomputes). ~3 s."""

from __future__ import annotations

from pathlib import Path

import typer

from common import one_line_errors, read_params

app = typer.Typer(add_completion=False)


@app.command()
@one_line_errors
def main(tables_dir: Path = typer.Option(...), out: Path = typer.Option(...),
         params: Path = Path("params.yaml")) -> None:
    import pandas as pd

    from lmclab.plots import plot_interpolation, plot_search_curves, plot_training
    from lmclab.report import write_report

    opts = read_params(params, "plot")
    curves = pd.read_parquet(tables_dir / "curves.parquet")
    pairs = pd.read_parquet(tables_dir / "pairs.parquet")
    history = pd.read_parquet(tables_dir / "history.parquet")
    figures = {
        "interpolation": plot_interpolation(curves, out / "figures" / "interpolation.png",
                                            dpi=opts["dpi"], band=opts["band"]),
        "training": plot_training(history, out / "figures" / "training.png", dpi=opts["dpi"]),
    }
    search_curves = tables_dir / "search_curves.parquet"
    if search_curves.is_file() and len(frame := pd.read_parquet(search_curves)):
        figures["search_curves"] = plot_search_curves(frame, out / "figures" / "search_curves.png",
                                                      dpi=opts["dpi"])
    write_report(out / "report.md", title=opts["title"], pairs=pairs, history=history,
                 methods=list(dict.fromkeys(pairs["method"])), figures=figures)


if __name__ == "__main__":
    app()
