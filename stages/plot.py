"""Stage plot: figures, ``report.md`` and the DVC plot data (``--curves``: CSV files that
``dvc plots show``/``diff`` draw, ``lmclab.report.plot_data``) from the saved tables and ``findings.json``
only (never recomputes); ``data.name`` and ``model.arch`` pick the paper's rows. ~3 s."""

from __future__ import annotations

from pathlib import Path

import typer
from _repo_src import DVC_YAML  # first: this repository's src/ on sys.path

from lmclab.pipeline.stage import one_line_errors, run_warm, stage_params

app = typer.Typer(add_completion=False)
# a run with permute.symmetry: orthogonal says so in the report's title (its methods act on canonical forms)
ORTHOGONAL_TITLE = ", aligned by orthogonal maps where the tracer proves them (permute.symmetry: orthogonal)"


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

    from lmclab.report.render import PlotSettings, render_run

    read = stage_params("plot", params, dvc_yaml=DVC_YAML)
    opts = read("plot")
    title = opts["title"] + ORTHOGONAL_TITLE * (read("permute.symmetry") == "orthogonal")  # which group aligned
    settings = PlotSettings(
        dpi=opts["dpi"], band=opts["band"], title=title, data=read("data.name"), arch=read("model.arch")
    )
    tables = {path.stem: pd.read_parquet(path) for path in sorted(tables_dir.glob("*.parquet"))}
    render_run(tables, json.loads(findings.read_text()), out, curves, settings)


if __name__ == "__main__":
    run_warm(app)
