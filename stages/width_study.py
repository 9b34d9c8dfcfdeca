"""Width study (Appendix H.4), run by hand after a `dvc exp` sweep over ``model.mlp.width`` or a conv
net's ``model.<arch>.width_multiplier`` (README
"Width study"): reads ``data/tables`` of every experiment (and, with ``--workspace``, of the
workspace), combines them by width and writes ``width.md``, ``width.png`` and the combined
Parquet tables to ``--out``. Not a DVC stage: its inputs are experiments, not files. ~5 s."""

from __future__ import annotations

import io
from pathlib import Path

import typer

from common import one_line_errors

app = typer.Typer(add_completion=False)
TABLES = ("spectrum", "energy", "pairs")


def _read(rev: str | None) -> dict:
    import dvc.api
    import pandas as pd

    out = {}
    for name in TABLES:
        path = f"data/tables/{name}.parquet"
        if rev is None:
            out[name] = pd.read_parquet(path)
        else:
            with dvc.api.open(path, rev=rev, mode="rb") as f:
                out[name] = pd.read_parquet(io.BytesIO(f.read()))
    return out


@app.command()
@one_line_errors
def main(out: Path = typer.Option(Path("reports/width")), exps: str = typer.Option(
             "", help="comma-separated experiment names (default: every experiment of the baseline)"),
         workspace: bool = typer.Option(False, help="also include the workspace's own run"),
         dpi: int = typer.Option(120)) -> None:
    import dvc.api

    from lmclab.atomic import atomic_path
    from lmclab.plots import plot_width
    from lmclab.analysis.width import alignment_markdown, width_tables

    wanted = [e for e in exps.split(",") if e]
    runs = {}
    for row in dvc.api.exp_show():
        name = row.get("Experiment")
        is_exp = name is not None and (not wanted or name in wanted)
        if is_exp or (workspace and row["rev"] == "workspace"):
            arch = row["model.arch"]
            key = f"model.{arch}.width" if f"model.{arch}.width" in row else f"model.{arch}.width_multiplier"
            width = row[key]
            if width in runs:
                raise ValueError(f"two runs have {key} = {width}; pick experiments with --exps")
            runs[width] = _read(name if is_exp else None)
            typer.echo(f"width {width}: {name or 'workspace'}")
    if len(runs) < 2:
        raise ValueError("width study: found fewer than two runs; queue a sweep first (README: Width study)")
    combined = width_tables(runs)
    for name, frame in combined.items():
        with atomic_path(out / f"{name}.parquet") as tmp:
            frame.to_parquet(tmp, index=False)
    plot_width(combined["spectrum"], combined["energy"], combined["alignment"], out / "width.png", dpi=dpi)
    with atomic_path(out / "width.md") as tmp:
        tmp.write_text("# Width study (Appendix H.4)\n\n![width](width.png)\n\n"
                       + alignment_markdown(combined["alignment"]) + "\n")


if __name__ == "__main__":
    app()
