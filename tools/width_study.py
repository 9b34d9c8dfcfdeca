"""Width study (Appendix H.4), run by hand after a `dvc exp` sweep over ``model.mlp.width`` or a conv
net's ``model.<arch>.width_multiplier`` (docs/analyses.md,
"Width study"): reads ``data/tables`` of every experiment (and, with ``--workspace``, of the
workspace), combines them by width and writes ``width.md``, ``width.png`` and the combined
Parquet tables to ``--out``. Not a DVC stage: its inputs are experiments, not files. ~5 s."""

from __future__ import annotations

from pathlib import Path

import typer

from lmclab.pipeline.runs import experiment_runs
from lmclab.pipeline.stage import one_line_errors

app = typer.Typer(add_completion=False)
TABLES = ("spectrum", "energy", "pairs")


@app.command()
@one_line_errors
def main(
    out: Path = typer.Option(Path("reports/width")),
    exps: str = typer.Option(
        "", help="comma-separated experiment names (default: those differing from the workspace only in width)"
    ),
    workspace: bool = typer.Option(False, help="also include the workspace's own run"),
    dpi: int = typer.Option(120),
) -> None:
    from lmclab.core.atomic import write_table, write_text
    from lmclab.report.plots import plot_width
    from lmclab.studies.width import alignment_markdown, width_tables

    def width(row: dict) -> float:
        arch = row["model.arch"]
        key = f"model.{arch}.width" if f"model.{arch}.width" in row else f"model.{arch}.width_multiplier"
        return row[key]

    runs = experiment_runs(
        width,
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


if __name__ == "__main__":
    app()
