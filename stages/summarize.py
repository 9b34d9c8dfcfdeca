"""Stage summarize: gather the measurements of the current params into Parquet tables (``curves``,
``pairs``, ``history``; from the analyses ``taylor``, ``theorem42``, ``spectrum``, ``energy``,
``output_scale``, ``table1``; three models ``three_edges``, ``three_curves``, ``landscape``; n models
``merge_many``, ``merge_many_methods``, ``merge_many_pairwise``, ``merge_many_trace``), the headline
metrics ``metrics/headline.json`` (what
``dvc exp show`` and ``dvc metrics diff`` compare; ``lmclab.report.headline``) and the detail JSON files
``{summary,three_models,merge_many}.json`` (every statistic, mean ± std) and ``environment.json`` (the
machine: ``lmclab.core.device.describe_machine``) in ``--detail-dir``, and
``findings.json`` beside the headline metrics: the paper's findings checked on this run
(``lmclab.studies.findings``). ~3 s."""

from __future__ import annotations

import json
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
    from lmclab.core.device import describe_machine
    from lmclab.report.headline import headline_metrics
    from lmclab.report.many_models import many_summary, objective_traces
    from lmclab.report.summary import (
        collect_pairs,
        collect_triples,
        metrics_summary,
        output_scales,
        table1,
        tables,
        three_summary,
        three_tables,
    )
    from lmclab.studies.findings import paper_findings
    from lmclab.studies.three_study import study_summary

    read = stage_params("summarize", params, dvc_yaml=DVC_YAML)
    methods, seeds = read("permute.methods"), read("train.seeds")
    three_methods = read("three.methods")
    out = tables(collect_pairs(measure_dir, perms_dir, read("permute.pairs"), methods))

    def read_all(folder, name):
        return pd.concat(
            [pd.read_parquet(folder / f"seed{s}" / name) for s in seeds],
            ignore_index=True,
        )

    out["spectrum"], out["energy"] = (read_all(spectra_dir, f"{n}.parquet") for n in ("spectrum", "energy"))
    out["output_scale"] = output_scales(out["spectrum"])
    out["table1"] = table1(out["pairs"], methods)
    out["history"] = pd.concat([pd.read_parquet(history_dir / f"seed{s}.parquet") for s in seeds], ignore_index=True)
    out.update(three_tables(collect_triples(connect_dir, read("three.triples"), three_methods)))
    out["merge_many"] = pd.read_parquet(merge_many_dir / "evaluation.parquet")
    out["merge_many_methods"] = pd.read_parquet(merge_many_dir / "methods.parquet")
    out["merge_many_pairwise"] = pd.read_parquet(merge_many_dir / "pairwise.parquet")
    trace = json.loads((merge_many_dir / "trace.json").read_text())
    out["merge_many_trace"] = objective_traces(trace, out["merge_many_methods"])
    for name, frame in out.items():
        write_table(tables_dir / f"{name}.parquet", frame)
    headline = headline_metrics(
        history=out["history"],
        pairs=out["pairs"],
        edges=out["three_edges"],
        evaluation=out["merge_many"],
        methods=methods,
        three_methods=three_methods,
    )
    study = study_summary(pd.read_parquet(three_study)) if three_study else None
    found = paper_findings(
        out["pairs"], out["spectrum"], out["energy"], out["three_edges"], methods, three_methods, study=study
    )
    findings = {
        "held": sum(f.holds is True for f in found),
        "tested": sum(f.holds is not None for f in found),
        "findings": [f.as_dict() for f in found],
    }
    for folder, name, summary in (
        (metrics_dir, "headline", headline),
        (metrics_dir, "findings", findings),
        (detail_dir, "summary", metrics_summary(out["pairs"], methods)),
        (detail_dir, "three_models", three_summary(out["three_edges"], three_methods)),
        (detail_dir, "merge_many", many_summary(out["merge_many"], out["merge_many_methods"])),
        (detail_dir, "environment", describe_machine()),  # where these numbers were taken
    ):
        write_json(folder / f"{name}.json", summary)


if __name__ == "__main__":
    run_warm(app)
