"""Stage connect (one instance per triple and method): align θb and θc to θa separately (with
``permute.symmetry: orthogonal``, their canonical forms, ``lmclab.archs.canonical``), then
barriers between every pair of {θa, π_b(θb), π_c(θc)} and the landscape on their plane (test split);
with ``measure.repair`` (``bn``: BatchNorm statistics; ``repair``: REPAIR, nets without BatchNorm) each
edge is measured without and with the repair, as in the measure stage.
``--aligned-b`` is the permute stage's output for the pair (θa, θb) with this method: its
permutation is θb's alignment (the same search, options and seed; not run twice), so only θc is
searched here. Writes ``perms.pt``, ``edges.json``, ``curves.parquet``, ``landscape.parquet``."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from _repo_src import DVC_YAML  # first: this repository's src/ on sys.path

from lmclab.pipeline.stage import (
    method_key,
    one_line_errors,
    params_errors,
    run_warm,
    search_errors,
    stage_params,
    under,
)
from lmclab.pipeline.torchrun import join_torchrun, relaunch_under_torchrun

app = typer.Typer(add_completion=False)
# the params.yaml key of each name the library's errors use
KEYS = {
    **under("three", "resolution", "margin"),
    **under("measure", "num_lambdas", "repair", "repair_samples", "train_samples", "gammas"),
}
REPAIRS = ("repair", "repair_samples")  # the measure settings it reads


@app.command()
@one_line_errors
@params_errors(KEYS)  # the library's errors, under their params.yaml keys
def main(
    method: str = typer.Option(...),
    seeds: str = typer.Option(..., help="a,b,c"),
    models: Path = typer.Option(...),
    data: Path = typer.Option(...),
    out: Path = typer.Option(...),
    aligned_b: Path | None = typer.Option(None, help="permute stage output (perm.pt, stats.json) of θb → θa"),
    params: Path = Path("params.yaml"),
) -> None:
    from lmclab.analysis.three_models import connect_triple
    from lmclab.archs.canonical import symmetric_forms
    from lmclab.core.data import load_split
    from lmclab.core.device import resolve_device
    from lmclab.core.distributed import leave_world
    from lmclab.search import check_method

    read = stage_params("connect", params, dvc_yaml=DVC_YAML, method=method)
    options = read(f"permute.{method}") or {}
    with search_errors(method):  # the library's errors, under their params.yaml keys
        options = check_method(method, options)  # checked once, here
    args = {"method": method, "seeds": seeds, "models": models, "data": data, "out": out, "aligned-b": aligned_b}
    argv = [f"--{k}={v}" for k, v in {**args, "params": params}.items() if v is not None]
    nproc = read("measure.nproc_per_node")
    relaunch_under_torchrun(__file__, argv, run_id=f"lmclab-connect-{seeds}-{method}", nproc_per_node=nproc)
    world = join_torchrun(resolve_device(read("device")))
    ckpts, train, test = load_triple(models, seeds), load_split(data, "train"), load_split(data, "test")
    forms, spec, points = symmetric_forms(
        *ckpts.values(), symmetry=read("permute.symmetry"), example_inputs=train.x[:2]
    )
    ckpts = dict(zip(ckpts, forms, strict=True))  # as permute aligned them: canonical forms for orthogonal maps
    settings = triple_settings(read, ckpts, train, world) | {"spec": spec, "points": points}
    aligned = {"b": load_alignment(aligned_b, method)} if aligned_b else {}
    with params_errors(KEYS, method_key("permute", method)):  # its own arguments first, then the search's options
        result = connect_triple(method, ckpts, train, test, options=options, aligned=aligned, **settings)
    leave_world(world)
    if world.is_main:  # one writer
        write_outputs(result, out, seeds, method)


def triple_settings(read, ckpts: dict, train, world) -> dict:
    """connect_triple's keywords from params.yaml: the search seed, the plane's grid, the λ grid, the
    R_γ thresholds, the repairs (``measure.*``) and the process world."""
    from lmclab.analysis.alignment import check_gammas
    from lmclab.analysis.pair import MeasureSettings, build_repairs
    from lmclab.archs import build_model
    from lmclab.core.metrics import lambda_grid

    check_gammas(read("measure.gammas"))
    model = build_model(ckpts["a"].arch, ckpts["a"].config).to(world.device)
    measure = MeasureSettings(**{k: read(f"measure.{k}") for k in REPAIRS})
    repair, repair_at = build_repairs(measure, model, train, world=world)
    settings = dict(seed=read("permute.seed"), resolution=read("three.resolution"), margin=read("three.margin"))
    settings |= dict(lams=lambda_grid(read("measure.num_lambdas")), gammas=read("measure.gammas"), repair=repair)
    settings |= dict(train_samples=read("measure.train_samples"))
    return settings | dict(repair_at=repair_at, device=world.device, world=world)


def write_outputs(result, out: Path, seeds: str, method: str) -> None:
    """``perms.pt``, ``curves.parquet``, ``landscape.parquet`` and ``edges.json`` of a connect ``result``."""
    import pandas as pd

    from lmclab.archs.checkpoint import atomic_save
    from lmclab.core.atomic import write_json, write_table

    atomic_save(result.perms, out / "perms.pt")
    for name, rows in (("curves", result.curves), ("landscape", result.landscape)):
        write_table(out / f"{name}.parquet", pd.DataFrame(rows))
    write_json(out / "edges.json", {"seeds": seeds, "method": method, "edges": result.edges, "search": result.search})
    bc = next(e for e in result.edges if e["edge"] == "b-c")
    typer.echo(f"{method} {seeds}: b-c test loss barrier {bc['test_loss_barrier_max']:.4f}")


def load_triple(models: Path, seeds: str) -> dict:
    """The checkpoints ``a``, ``b``, ``c`` of ``seeds`` (``"a,b,c"``) in ``models``, of one architecture."""
    from lmclab.archs.checkpoint import check_same_architecture, load_checkpoint

    paths = {k: models / f"seed{s}.pt" for k, s in zip("abc", seeds.split(","), strict=True)}
    ckpts = {k: load_checkpoint(p) for k, p in paths.items()}
    for k in "bc":
        check_same_architecture(ckpts["a"], ckpts[k], paths["a"], paths[k])
    return ckpts


def load_alignment(folder: Path, method: str):
    """The permute stage's ``perm.pt`` and ``stats.json`` in ``folder`` as a search result of ``method``."""
    import torch

    from lmclab.search.result import SearchResult

    stats_file, perm_file = folder / "stats.json", folder / "perm.pt"
    if not (stats_file.is_file() and perm_file.is_file()):
        raise ValueError(f"--aligned-b: expected {folder} to hold perm.pt and stats.json (a permute output)")
    stats = json.loads(stats_file.read_text())
    if stats.get("method") != method:
        raise ValueError(f"--aligned-b: {folder} holds a {stats.get('method')!r} alignment, expected {method!r}")
    perm = torch.load(perm_file, map_location="cpu", weights_only=True)
    return SearchResult(perm, {k: v for k, v in stats.items() if k != "method"})


if __name__ == "__main__":
    run_warm(app)
