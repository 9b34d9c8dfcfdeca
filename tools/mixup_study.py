"""Mixup study, run by hand after `dvc exp run` of the pipeline with ``train.mixup_alpha`` > 0
(docs/analyses.md): reads ``data/tables/{pairs,history}.parquet`` of every experiment that differs from the
workspace only in ``train.mixup_alpha`` (and, with ``--workspace``, of the workspace's own run, usually
α = 0), and writes ``--out``/``mixup.md`` (per α: endpoint accuracy, NC1, ETF distance, equinorm CV; per
method: test B½, L2 reduction, R_0.3) and ``table.parquet``. Not a DVC stage: its inputs are experiments. ~5 s."""

from __future__ import annotations

from pathlib import Path

import typer

from lmclab.pipeline.runs import experiment_runs
from lmclab.pipeline.stage import one_line_errors

app = typer.Typer(add_completion=False)
PARAM = "train.mixup_alpha"


@app.command()
@one_line_errors
def main(
    out: Path = typer.Option(..., help="folder for mixup.md and table.parquet"),
    exps: str = typer.Option(
        "", help="comma-separated experiment names (default: those differing only in train.mixup_alpha)"
    ),
    workspace: bool = typer.Option(False, help="also include the workspace's own run"),
    methods: str = typer.Option("identity,wm,wm_sinkhorn", help="methods to tabulate"),
) -> None:
    from lmclab.core.atomic import write_table, write_text
    from lmclab.studies.mixup import mixup_markdown, mixup_table

    def value(row: dict) -> float:
        if PARAM not in row:
            raise ValueError(f"{PARAM}: not a parameter of these experiments")
        return float(row[PARAM])

    runs = experiment_runs(value, ("pairs", "history"), swept=lambda key: key == PARAM, exps=exps, workspace=workspace)
    table = mixup_table(runs, methods.split(","))
    write_table(out / "table.parquet", table)
    write_text(
        out / "mixup.md",
        "# Endpoints trained with and without mixup\n\nMean ± sample std over seeds (endpoints) "
        "and pairs (methods); B½ = test loss barrier at λ = ½ (identity: before alignment).\n\n"
        + mixup_markdown(table)
        + "\n",
    )


if __name__ == "__main__":
    app()
