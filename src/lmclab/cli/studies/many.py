"""The n-model comparison at full length (docs "Methods", many models): every n-model method on
the default run's four MLPs, with the library's default options — run by hand, not a DVC stage: its input
is a finished run of the merge_many stage with all methods, which costs more than the default run's
time budget (C2M3's 100 Frank–Wolfe iterations and ZipIt!'s clustering take minutes on 2 cores).

    git clone . ../run-many && cd ../run-many
    dvc exp run -S 'merge_many.methods=[merge_many,c2m3,sync,star,cca,zipit]' merge_many
    lmclab study many collect --run ../run-many

``collect`` reads the run's ``data/merge_many/`` (``evaluation``, ``methods``, ``pairwise`` tables and
``trace.json``), its params.yaml and commit, and writes ``reports/many_models/``: the three tables,
``run.json`` (commit, models, options, machine), ``many_models.png`` and ``many_models.md``.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from lmclab.pipeline.stage import one_line_errors, parse_yaml

if TYPE_CHECKING:  # the command's modules load what they compute with when it runs (`lmclab --help` stays quick)
    import pandas as pd

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.split("\n\n")[0])
TABLES = ("evaluation", "methods", "pairwise")
REBUILD = (
    "Rebuilt by `git clone . ../run-many && cd ../run-many && dvc exp run -S "
    "'merge_many.methods=[merge_many,c2m3,sync,star,cca,zipit]' merge_many`, then "
    "`lmclab study many collect --run ../run-many` (`lmclab study many --help`)."
)


def _run_info(run: Path, trace: dict) -> dict:
    from lmclab.core.device import describe_machine

    params = parse_yaml((run / "params.yaml").read_text())
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=run, capture_output=True, text=True)
    many = params["merge_many"]
    return {
        "commit": commit.stdout.strip(),
        "model": {"arch": params["model"]["arch"], **params["model"][params["model"]["arch"]]},
        "epochs": params["train"]["epochs"],
        "seeds": many["seeds"],
        "repair": many["repair"],
        "options": {m: many[m] for m in many["methods"]},
        "seconds": {m: stats["seconds"] for m, stats in trace["methods"].items()},
        "machine": describe_machine(),
    }


def markdown(info: dict, evaluation: pd.DataFrame, methods: pd.DataFrame) -> str:
    from lmclab.report.many_models import many_table

    model = ", ".join(f"{k} {v}" for k, v in info["model"].items())
    options = "; ".join(f"{m}: {o}" for m, o in info["options"].items())
    return "\n".join(
        [
            "# N models in one frame: every n-model method on the default run's models",
            "",
            REBUILD,
            "",
            f"Run at commit {info['commit']}: {len(info['seeds'])} models ({model}; {info['epochs']} epochs; seeds "
            f"{info['seeds']}), repair `{info['repair']}`, options {options}. "
            f"Machine: {info['machine']['cpu']}, {info['machine']['cores']} cores. {info['note']}".rstrip(),
            "",
            many_table(evaluation, methods),
            "",
            "F / best F: the shared objective Σ_{i<j} ⟨π_i θ_i, π_j θ_j⟩ of the method's permutations over the "
            "best method's; cycle error: the fraction of units that the pairwise maps send around a triple "
            "elsewhere than directly (0 for every method with one frame); pair B½: the mean test barrier at "
            "λ = ½ between θ_i and π_ij(θ_j) over the pairs; s: the method's wall time in this run. "
            "CCA Merge and ZipIt! merge through general linear maps: no F, cycle error or pairwise map.",
            "",
            "![n-model methods](many_models.png)",
            "",
        ]
    )


@app.command()
@one_line_errors
def collect(
    run: Path = typer.Option(..., help="a run whose merge_many stage finished (RUN/data/merge_many/)"),
    out: Path = typer.Option(Path("reports/many_models")),
    dpi: int = typer.Option(120),
    note: str = typer.Option("", help="a sentence on the run the page should carry (e.g. how loaded the machine was)"),
) -> None:
    """Build reports/many_models/ from a finished run."""
    import pandas as pd

    from lmclab.core.atomic import write_json, write_table, write_text
    from lmclab.report.many_models import objective_traces, plot_many

    folder = run / "data" / "merge_many"
    if not all((folder / f"{name}.parquet").is_file() for name in TABLES):
        raise ValueError(f"--run: expected a run with {folder}/{{{','.join(TABLES)}}}.parquet, got {run}")
    tables = {name: pd.read_parquet(folder / f"{name}.parquet") for name in TABLES}
    trace = json.loads((folder / "trace.json").read_text())
    info = {**_run_info(run, trace), "note": note}
    for name, frame in tables.items():
        write_table(out / f"{name}.parquet", frame)
    write_json(out / "run.json", info)
    traces = objective_traces(trace, tables["methods"])
    plot_many(traces, tables["evaluation"], out / "many_models.png", dpi=dpi)
    write_text(out / "many_models.md", markdown(info, tables["evaluation"], tables["methods"]))
    typer.echo(f"{out}: {len(tables['methods'])} methods")
