"""Sweep study (Appendix H.5), run by hand after a `dvc exp` sweep over one parameter, e.g.
``train.weight_decay`` or ``train.lr`` (docs/analyses.md): reads ``data/tables/pairs.parquet`` of
every experiment (and, with ``--workspace``, of the workspace's own run), and writes to ``--out``
``sweep.md`` (per value and method: test B½, L2 reduction, R_0.3, mean ± std over pairs; whether the
paper's trends hold), ``sweep.png`` and the combined tables as Parquet. Not a DVC stage: its inputs
are experiments, not files. ~5 s."""

from __future__ import annotations

from pathlib import Path

import typer

from lmclab.pipeline.runs import experiment_runs
from lmclab.pipeline.stage import one_line_errors

app = typer.Typer(add_completion=False)


@app.command()
@one_line_errors
def main(
    param: str = typer.Option(..., help="the swept params.yaml key, e.g. train.weight_decay"),
    out: Path = typer.Option(..., help="folder for sweep.md, sweep.png and the tables"),
    exps: str = typer.Option(
        "", help="comma-separated experiment names (default: those differing from the workspace only in --param)"
    ),
    workspace: bool = typer.Option(False, help="also include the workspace's own run"),
    methods: str = typer.Option("identity,wm,wm_sinkhorn,ste_sinkhorn", help="methods to tabulate"),
    dpi: int = typer.Option(120),
) -> None:
    import pandas as pd

    from lmclab.core.atomic import write_json, write_table, write_text
    from lmclab.report.plots_sweep import plot_sweep
    from lmclab.studies.findings import roles
    from lmclab.studies.sweep import sweep_markdown, sweep_points, sweep_table, trends

    def value(row: dict) -> float:
        if param not in row:
            raise ValueError(f"--param {param}: not a parameter of these experiments")
        return float(row[param])

    runs = experiment_runs(value, ("pairs",), swept=lambda key: key == param, exps=exps, workspace=workspace)
    points = sweep_points({v: t["pairs"] for v, t in runs.items()}, methods.split(","))
    table = sweep_table(points)
    wm = roles(list(points["method"].unique())).get("WM")
    verdicts = trends(points, wm, param) if wm else []
    for name, frame in (("points", points), ("table", table), ("trends", pd.DataFrame(verdicts))):
        write_table(out / f"{name}.parquet", frame)
    plot_sweep(table, out / "sweep.png", param=param, dpi=dpi)
    write_text(
        out / "sweep.md",
        f"# Sweep of {param} (Appendix H.5)\n\n![sweep](sweep.png)\n\n" + sweep_markdown(table, verdicts, param) + "\n",
    )
    write_json(out / "trends.json", verdicts)


if __name__ == "__main__":
    app()
