"""The sweep studies over ``dvc exp`` runs, run by hand after a sweep of the pipeline — not DVC stages: their
inputs are experiments, not files (docs/analyses.md). Each reads ``data/tables`` of every experiment that
differs from the workspace only in the swept keys (or those named by ``--exps``; with ``--workspace``, the
workspace's own run too, :func:`lmclab.pipeline.runs.experiment_runs`) and writes a page, a figure and the
combined Parquet tables to ``--out``; each takes about 5 s.

    lmclab study width [--out reports/width]        # model.mlp.width or model.<arch>.width_multiplier (H.4)
    lmclab study sweep --param train.weight_decay --out reports/sweeps/weight_decay   # one parameter (H.5)
    lmclab study mixup --out reports/mixup --workspace  # train.mixup_alpha, the workspace's α = 0 beside it
"""

from __future__ import annotations

from pathlib import Path

import typer

from lmclab.pipeline.runs import experiment_runs
from lmclab.pipeline.stage import one_line_errors

TABLES = ("spectrum", "energy", "pairs")  # the width study's
MIXUP = "train.mixup_alpha"


@one_line_errors
def width(
    out: Path = typer.Option(Path("reports/width")),
    exps: str = typer.Option(
        "", help="comma-separated experiment names (default: those differing from the workspace only in width)"
    ),
    workspace: bool = typer.Option(False, help="also include the workspace's own run"),
    dpi: int = typer.Option(120),
) -> None:
    """A width sweep (Appendix H.4): the spectrum, energy and alignment tables combined by width."""
    from lmclab.core.atomic import write_table, write_text
    from lmclab.report.plots import plot_width
    from lmclab.studies.width import alignment_markdown, width_tables

    def width_of(row: dict) -> float:
        arch = row["model.arch"]
        key = f"model.{arch}.width" if f"model.{arch}.width" in row else f"model.{arch}.width_multiplier"
        return row[key]

    runs = experiment_runs(
        width_of,
        TABLES,
        swept=lambda key: key.split(".")[-1] in ("width", "width_multiplier"),
        exps=exps,
        workspace=workspace,
    )
    combined = width_tables(runs)
    for name, frame in combined.items():
        write_table(out / f"{name}.parquet", frame)
    plot_width(combined["spectrum"], combined["energy"], combined["alignment"], out / "width.png", dpi=dpi)
    write_text(
        out / "width.md",
        "# Width study (Appendix H.4)\n\n![width](width.png)\n\n" + alignment_markdown(combined["alignment"]) + "\n",
    )


@one_line_errors
def sweep(
    param: str = typer.Option(..., help="the swept params.yaml key, e.g. train.weight_decay"),
    out: Path = typer.Option(..., help="folder for sweep.md, sweep.png and the tables"),
    exps: str = typer.Option(
        "", help="comma-separated experiment names (default: those differing from the workspace only in --param)"
    ),
    workspace: bool = typer.Option(False, help="also include the workspace's own run"),
    methods: str = typer.Option("identity,wm,wm_sinkhorn,ste_sinkhorn", help="methods to tabulate"),
    dpi: int = typer.Option(120),
) -> None:
    """A sweep over one parameter (Appendix H.5): per value and method, test B½, L2 reduction and R_0.3, and
    whether the paper's trends hold."""
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


@one_line_errors
def mixup(
    out: Path = typer.Option(..., help="folder for mixup.md and table.parquet"),
    exps: str = typer.Option(
        "", help="comma-separated experiment names (default: those differing only in train.mixup_alpha)"
    ),
    workspace: bool = typer.Option(False, help="also include the workspace's own run"),
    methods: str = typer.Option("identity,wm,wm_sinkhorn", help="methods to tabulate"),
) -> None:
    """Endpoints trained with and without mixup: per α, NC1, ETF distance and equinorm CV; per method, test B½, L2
    reduction and R_0.3 (reads the pairs and history tables of each experiment)."""
    from lmclab.core.atomic import write_table, write_text
    from lmclab.studies.mixup import mixup_markdown, mixup_table

    def value(row: dict) -> float:
        if MIXUP not in row:
            raise ValueError(f"{MIXUP}: not a parameter of these experiments")
        return float(row[MIXUP])

    runs = experiment_runs(value, ("pairs", "history"), swept=lambda key: key == MIXUP, exps=exps, workspace=workspace)
    table = mixup_table(runs, methods.split(","))
    write_table(out / "table.parquet", table)
    write_text(
        out / "mixup.md",
        "# Endpoints trained with and without mixup\n\nMean ± sample std over seeds (endpoints) "
        "and pairs (methods); B½ = test loss barrier at λ = ½ (identity: before alignment).\n\n"
        + mixup_markdown(table)
        + "\n",
    )
