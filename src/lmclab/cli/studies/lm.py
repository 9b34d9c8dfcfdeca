"""The language-model study (docs "Language models"): a byte-level GPT's barriers after every alignment, with
and without REPAIR, how the barrier after alignment changes with width and training length (Appendix H.4),
and whether the paper's explanation holds (better alignment, lower barrier) — run by hand, not a DVC
stage: its inputs are finished runs of the pipeline.

    git clone . ../run-lm && cd ../run-lm && lmclab preset pydoc_gpt && dvc repro
    # each sweep run: the same clone procedure with the preset and the -S overrides of docs/language-models.md
    lmclab study lm collect --run ../run-lm --width 32=../run-w32 --width 128=../run-w128 \\
        --epochs 2=../run-e2 --epochs 10=../run-e10

The preset's run is also the sweeps' point at its own width and epochs; a sweep compares the methods every one
of its runs has. ``collect`` reads each run's
``data/tables/{pairs,alignment,history}.parquet``, its params.yaml and commit, and writes ``reports/lm/``:
``points.parquet`` (the preset run's pairs, :func:`lmclab.studies.lm_study.study_points`), ``table.parquet``
(per method), ``roles.parquet`` (R_0.3 per residual stream, attention, MLP), ``sweep_points.parquet`` and
``sweep.parquet``, ``explanation.json``, ``trends.json``, ``runs.json``, ``lm.md`` and ``lm.png``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from lmclab.pipeline.stage import one_line_errors

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.split("\n\n")[0])


def _sweep_runs(items: list[str], kind: str) -> dict[str, Path]:
    out = {}
    for item in items:
        value, sep, folder = item.partition("=")
        if not sep:
            raise ValueError(f"--{kind}: expected VALUE=DIR of a finished run, got {item!r}")
        out[f"{kind} {value}"] = Path(folder)
    return out


def _sweeps(dirs: dict[str, Path], runs: dict[str, dict]) -> tuple[Any, Any, list[dict]]:
    """The sweeps' points, their summary and the trends tested, over the methods every run of a sweep has."""
    import pandas as pd

    from lmclab.cli.studies.lm_page import SWEPT, run_table, sweep_value
    from lmclab.studies.lm_study import study_points, sweep_points, sweep_summary, sweep_trends

    sweeps, frames, verdicts = [], [], []
    for kind in SWEPT:
        names = ["preset", *(n for n in dirs if n.startswith(f"{kind} "))]
        if len(names) < 2:
            continue
        value = {n: sweep_value(runs[n], kind) for n in names}
        measured = {value[n]: study_points(run_table(dirs[n], "pairs")) for n in names}
        common = set.intersection(*(set(p["method"]) for p in measured.values()))  # the methods every run has
        found = sweep_points(
            {v: p[p["method"].isin(common)] for v, p in measured.items()},
            {value[n]: runs[n]["final_test_loss"] for n in names},
        ).assign(sweep=kind)
        frames.append(found)
        sweeps.append(sweep_summary(found).assign(sweep=kind))
        verdicts += [
            v for m in ("wm", "wm_sinkhorn") if m in set(found["method"]) for v in sweep_trends(found, m, kind)
        ]
    sweep_points_all = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    sweep_table = pd.concat(sweeps, ignore_index=True) if sweeps else pd.DataFrame()
    return sweep_points_all, sweep_table, verdicts


@app.command()
@one_line_errors
def collect(
    run: Path = typer.Option(..., help="the preset's finished run (every method, REPAIR)"),
    width: list[str] = typer.Option([], help="VALUE=DIR of a run at another width (repeat)"),
    epochs: list[str] = typer.Option([], help="VALUE=DIR of a run trained for other epochs (repeat)"),
    out: Path = typer.Option(Path("reports/lm")),
    dpi: int = typer.Option(120),
) -> None:
    """Build reports/lm/ from finished runs."""
    from lmclab.cli.studies.lm_page import ALIGNING, markdown, run_info, run_table
    from lmclab.core.atomic import write_json, write_table, write_text
    from lmclab.report.plots_lm import plot_lm_study
    from lmclab.studies.lm_study import explanation, method_table, role_table, study_points

    dirs = {"preset": run} | _sweep_runs(width, "width") | _sweep_runs(epochs, "epochs")
    runs = {name: run_info(d) for name, d in dirs.items()}
    for name in runs.keys() - {"preset"}:  # the sweeps are compared by their barriers, not timed
        del runs[name]["search_seconds"]
    points = study_points(run_table(run, "pairs"))
    table, roles = method_table(points), role_table(run_table(run, "alignment"))
    sweep_points_all, sweep_table, verdicts = _sweeps(dirs, runs)
    found = explanation(points, [m for m in ALIGNING if m in set(points["method"])])
    for name, frame in (("points", points), ("table", table), ("roles", roles)):
        write_table(out / f"{name}.parquet", frame)
    write_table(out / "sweep_points.parquet", sweep_points_all)
    write_table(out / "sweep.parquet", sweep_table)
    write_json(out / "explanation.json", found)
    write_json(out / "trends.json", verdicts)
    write_json(out / "runs.json", runs)
    plot_lm_study(sweep_table, points, out / "lm.png", dpi=dpi)
    write_text(out / "lm.md", markdown(table, roles, sweep_table, verdicts, found, runs))
    typer.echo(f"{out}: {len(table)} methods, {len(runs)} runs")


@app.command("orthogonal")
@one_line_errors
def orthogonal(
    run: Path = typer.Option(..., help="the preset's finished run"),
    orthogonal: Path = typer.Option(..., help="a copy of it rerun with permute.symmetry: orthogonal"),
    width: list[str] = typer.Option([], help="WIDTH=FOLDER: a run at that width (orthogonal; permutations: its sweep)"),
    learned: list[Path] = typer.Option([], help="a copy of --orthogonal rerun with other permute.ste settings"),
    out: Path = typer.Option(Path("reports/lm")),
) -> None:
    """Build reports/lm/orthogonal.md from the preset's run and its copy aligned by orthogonal maps (and the width
    sweep's runs aligned so, beside the study's permutation sweep; the copies training learned matching longer or
    at a range of λ; the barriers by family of layers where the runs measured them)."""
    from lmclab.cli.studies.lm_orthogonal import build
    from lmclab.cli.studies.lm_widths import width_runs

    build(run, orthogonal, out, width_runs(width), learned)
