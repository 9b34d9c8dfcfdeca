"""The three-model study (the paper's Table 3 and Figure 5 on the default run's digits), run by hand —
not a DVC stage: its inputs are experiments, not files (docs/analyses.md, "Three-model study").

    lmclab study three queue              # queue one `dvc exp` per study point (targets: connect)
    dvc queue start -j 1                  # run them (the width-2048 point is left out: --points)
    lmclab study three collect            # reports/three_study/: three_study.md, .png, .parquet

Every point is the default run with 9 models in 3 disjoint triples, the paper's WM and STE
(wm_sinkhorn, ste_sinkhorn) and coordinate-descent WM, and one setting changed (POINTS). Only the
stages the connect stage needs run (validate, download, train, the permute stages of each triple's
(θa, θb) pair, whose alignment connect reuses, and connect); a point whose models are the default's
restores them from the run cache. ``collect`` reads every queued point's
``data/connect/*/*/edges.json`` from its experiment (by name, ``three-<point>``) and builds the table
and figure of :mod:`lmclab.studies.three_study`; a point with no experiment here (run on another
machine) keeps its rows of the committed ``edges.parquet``, so one new point can be added alone.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import typer

from lmclab.pipeline.stage import one_line_errors, parse_yaml

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.split("\n\n")[0])
PREFIX = "three-"
TRIPLES = [[0, 2, 4], [1, 3, 5], [6, 7, 8]]  # the default run's two triples and a third
BASE = {
    "train.seeds": list(range(9)),
    "three.triples": TRIPLES,
    "permute.pairs": [t[:2] for t in TRIPLES],  # connect reuses permute's θb → θa alignment
    "three.methods": ["wm_sinkhorn", "ste_sinkhorn", "wm"],
}
REBUILD = (
    "Rebuilt by `lmclab study three queue` (one `dvc exp` per setting, `--dry-run` prints them), "
    "`dvc queue start -j 1`, then `lmclab study three collect` (docs: Analyses and studies)."
)
# point -> (axis, value shown, overrides); the default's own values are the "default" point
POINTS: dict[str, tuple[str, str, dict]] = {
    "default": ("default", "default", {}),
    "epochs-50": ("training epochs", "50", {"train.epochs": 50}),
    "epochs-100": ("training epochs", "100", {"train.epochs": 100}),
    "train-1k": ("training digits", "1000", {"data.max_train": 1000}),
    "train-2k": ("training digits", "2000", {"data.max_train": 2000}),
    "width-128": ("width", "128", {"model.mlp.width": 128}),
    "width-1024": ("width", "1024", {"model.mlp.width": 1024}),
    "width-2048": ("width", "2048", {"model.mlp.width": 2048}),
    # Sinkhorn WM's lr scaled with the width (docs/methods.md: its step is ≈ lr·g/ε): ≈ the ratio of the
    # first group's start gradient at width 512 to that at 1024 (9.5) and 2048 (82), wm_sinkhorn_gradients.json
    "width-1024-wm-lr10": (
        "width (Sinkhorn WM lr scaled)",
        "1024, lr 10",
        {"model.mlp.width": 1024, "permute.wm_sinkhorn.lr": 10},
    ),
    "width-2048-wm-lr80": (
        "width (Sinkhorn WM lr scaled)",
        "2048, lr 80",
        {"model.mlp.width": 2048, "permute.wm_sinkhorn.lr": 80},
    ),
    "wm-10x100": (
        "Sinkhorn WM schedule",
        "10 × 100",
        {"permute.wm_sinkhorn.epochs": 10, "permute.wm_sinkhorn.iterations": 100},
    ),
    "ste-epochs-20": ("STE epochs", "20", {"permute.ste_sinkhorn.epochs": 20}),
    "ste-init-wm": ("STE initialisation", "wm", {"permute.ste_sinkhorn.init": "wm"}),
    "epochs-100-wm-10x100": (
        "paper's training and WM schedule",
        "100 epochs, 10 × 100",
        {"train.epochs": 100, "permute.wm_sinkhorn.epochs": 10, "permute.wm_sinkhorn.iterations": 100},
    ),
}
# the params.yaml keys each axis varies (the "default" point stands for their values in params.yaml)
AXIS_KEYS = {
    "training epochs": ("train.epochs",),
    "training digits": ("data.max_train",),
    "width": ("model.mlp.width",),
    "width (Sinkhorn WM lr scaled)": ("model.mlp.width", "permute.wm_sinkhorn.lr"),
    "Sinkhorn WM schedule": ("permute.wm_sinkhorn.epochs", "permute.wm_sinkhorn.iterations"),
    "STE epochs": ("permute.ste_sinkhorn.epochs",),
    "STE initialisation": ("permute.ste_sinkhorn.init",),
}


def defaults(params: Path) -> dict[str, str]:
    """Each axis's value in ``params`` (the default run's), as the study's page shows it."""
    tree = parse_yaml(params.read_text(), params)

    def value(key: str) -> str:
        node = tree
        for part in key.split("."):
            node = node[part]
        return "all" if node is None else str(node)

    return {axis: " × ".join(value(k) for k in keys) for axis, keys in AXIS_KEYS.items()}


# About 12 min per Sinkhorn WM search on 2 idle cores: left out unless named.
COSTLY = ("width-2048", "width-2048-wm-lr80")


def queue_command(point: str) -> list[str]:
    """The ``dvc exp run --queue`` command of one study point."""
    settings = {**BASE, **POINTS[point][2]}
    sets = [arg for k, v in settings.items() for arg in ("-S", f"{k}={json.dumps(v).replace(' ', '')}")]
    return ["dvc", "exp", "run", "--queue", "-n", PREFIX + point, *sets, "connect"]


def _points(points: str) -> list[str]:
    names = [p for p in points.split(",") if p] or [p for p in POINTS if p not in COSTLY]
    unknown = [p for p in names if p not in POINTS]
    if unknown:
        raise ValueError(f"--points: unknown point(s) {', '.join(unknown)}; known: {', '.join(POINTS)}")
    return names


@app.command()
@one_line_errors
def queue(
    points: str = typer.Option("", help="comma-separated points (default: all but " + ", ".join(COSTLY) + ")"),
    dry_run: bool = typer.Option(False, help="print the commands instead of queueing them"),
) -> None:
    """Queue one experiment per study point."""
    for point in _points(points):
        command = queue_command(point)
        typer.echo(shlex.join(command))
        if not dry_run:
            subprocess.run(command, check=True)


def _edges(experiment: str) -> list[dict]:
    """Every edges.json under data/connect of ``experiment`` (from its DVC cache), each edge with
    whether a search behind it stalled and, for a–b and a–c, the ⟨θa, π(θ)⟩ its search returned."""
    from lmclab.pipeline.runs import experiment_files
    from lmclab.studies.three_study import SEARCHED, edge_stalled, search_objective

    rows = []
    for text in experiment_files(experiment, "data/connect/*/*/edges.json").values():
        blob = json.loads(text)
        triple, search = "seed" + blob["seeds"].replace(",", "-seed"), blob.get("search", {})
        for edge in blob["edges"]:
            found = search.get(SEARCHED[edge["edge"]], {})  # a–b: θb's search, a–c: θc's; b–c: none
            extra = {"stalled": edge_stalled(edge["edge"], search), "objective": search_objective(found)}
            rows.append({"triple": triple, "method": blob["method"], **edge, **extra})
    return rows


@app.command()
@one_line_errors
def collect(
    out: Path = typer.Option(Path("reports/three_study")),
    points: str = typer.Option("", help="comma-separated points (default: every queued point that finished)"),
    dpi: int = typer.Option(120),
    params: Path = typer.Option(Path("params.yaml"), help="the default run's parameters the page names"),
) -> None:
    """Build the study's table, figure and Parquet tables from the finished experiments."""
    import pandas as pd

    from lmclab.core.atomic import write_table, write_text
    from lmclab.report.plots_three import plot_three_study
    from lmclab.studies.three_study import study_markdown, study_table

    frames = []
    committed = pd.read_parquet(out / "edges.parquet") if (out / "edges.parquet").is_file() else None
    for point in _points(points) if points else POINTS:
        try:
            rows = _edges(PREFIX + point)
        except Exception as exc:  # not run here, still queued or failed: dvc names no such revision
            kept = committed[committed["point"] == point] if committed is not None else []
            if len(kept):  # run on another machine: its committed rows stay
                frames.append(kept)
                typer.echo(f"{point}: {len(kept)} edges kept from {out / 'edges.parquet'} (no experiment here)")
                continue
            typer.echo(f"{point}: left out ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})")
            continue
        axis, value, _ = POINTS[point]
        frames.append(pd.DataFrame(rows).assign(point=point, axis=axis, value=value))
        typer.echo(f"{point}: {len(rows)} edges")
    if not frames:
        raise ValueError("no finished study experiment; run `lmclab study three queue` first")
    edges = pd.concat(frames, ignore_index=True)
    table = study_table(edges)
    for name, frame in (("edges", edges), ("table", table)):
        write_table(out / f"{name}.parquet", frame)
    plot_three_study(table, edges, out / "three_study.png", dpi=dpi)
    write_text(out / "three_study.md", study_markdown(table, defaults=defaults(params), rebuild=REBUILD))
