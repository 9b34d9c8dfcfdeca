"""Stage summarize: gather the measurements of the current params into Parquet tables (``curves``,
``pairs``, ``history``; from the analyses ``taylor``, ``theorem42``, ``alignment`` (each layer's share of R_γ),
``spectrum``, ``energy``,
``output_scale``, ``table1``; three models ``three_edges``, ``three_curves``, ``landscape``; n models
``merge_many``, ``merge_many_methods``, ``merge_many_pairwise``, ``merge_many_trace``), the headline
metrics ``metrics/headline.json`` (what
``dvc exp show`` and ``dvc metrics diff`` compare; ``lmclab.report.headline``) and the detail JSON files
``{summary,three_models,merge_many}.json`` (every statistic, mean ± std) and ``environment.json`` (the
machine: ``lmclab.core.device.describe_machine``) in ``--detail-dir``, and
``findings.json`` beside the headline metrics: the paper's findings checked on this run
(``lmclab.studies.findings``). ~3 s."""

from __future__ import annotations

from pathlib import Path

import typer
from _repo_src import DVC_YAML  # first: this repository's src/ on sys.path

from lmclab.pipeline.stage import one_line_errors, run_warm, stage_params

app = typer.Typer(add_completion=False)


@app.command()
@one_line_errors
def main(
    measure_dir: Path = typer.Option(...),
    perms_dir: Path = typer.Option(...),
    history_dir: Path = typer.Option(...),
    spectra_dir: Path = typer.Option(...),
    connect_dir: Path = typer.Option(...),
    merge_many_dir: Path = typer.Option(...),
    tables_dir: Path = typer.Option(...),
    metrics_dir: Path = typer.Option(...),
    detail_dir: Path = typer.Option(...),
    three_study: Path | None = typer.Option(None, help="the three-model study's table.parquet (the finding's note)"),
    params: Path = Path("params.yaml"),
) -> None:
    import pandas as pd

    from lmclab.core.atomic import write_json, write_table
    from lmclab.report.run_summary import RunFolders, RunSettings, run_summaries, run_tables
    from lmclab.studies.three_study import study_summary

    read = stage_params("summarize", params, dvc_yaml=DVC_YAML)
    run = RunSettings(
        pairs=read("permute.pairs"),
        methods=read("permute.methods"),
        seeds=read("train.seeds"),
        triples=read("three.triples"),
        three_methods=read("three.methods"),
    )
    folders = RunFolders(measure_dir, perms_dir, history_dir, spectra_dir, connect_dir, merge_many_dir)
    tables = run_tables(folders, run)
    for name, frame in tables.items():
        write_table(tables_dir / f"{name}.parquet", frame)
    study = study_summary(pd.read_parquet(three_study)) if three_study else None
    for name, summary in run_summaries(tables, run, study).items():
        write_json((metrics_dir if name in ("headline", "findings") else detail_dir) / f"{name}.json", summary)


if __name__ == "__main__":
    run_warm(app)
