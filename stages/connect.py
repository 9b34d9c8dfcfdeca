"""Stage connect (one instance per triple and method): align θb and θc to θa separately, then
barriers between every pair of {θa, π_b(θb), π_c(θc)} and the landscape on their plane (test split);
with ``measure.bn_repair`` (BatchNorm nets) or ``measure.repair`` (REPAIR, nets without BatchNorm) each
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
    one_line_errors,
    params_errors,
    run_warm,
    search_errors,
    search_key,
    stage_params,
    under,
)
from lmclab.pipeline.torchrun import join_torchrun, relaunch_under_torchrun

app = typer.Typer(add_completion=False)
# the params.yaml key of each argument the library's errors name
KEYS = {**under("three", "resolution", "margin"), **under("measure", "num_lambdas", gamma="gammas")}
REPAIR_KEYS = {
    "bn_repair": under("measure", num_samples="bn_repair_samples"),
    "repair": under("measure", num_samples="repair_samples"),
}


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
    import pandas as pd

    from lmclab.analysis.three_models import connect_triple
    from lmclab.archs import build_model
    from lmclab.archs.checkpoint import atomic_save, check_same_architecture, load_checkpoint
    from lmclab.core.atomic import write_json, write_table
    from lmclab.core.data import load_split
    from lmclab.core.device import resolve_device
    from lmclab.core.distributed import leave_world
    from lmclab.core.metrics import lambda_grid
    from lmclab.search import check_method

    read = stage_params("connect", params, dvc_yaml=DVC_YAML, method=method)
    options = read(f"permute.{method}") or {}
    with search_errors(method):  # the library's errors, under their params.yaml keys
        check_method(method, options)
    relaunch_under_torchrun(
        __file__,
        [
            f"--method={method}",
            f"--seeds={seeds}",
            f"--models={models}",
            f"--data={data}",
            f"--out={out}",
            *([f"--aligned-b={aligned_b}"] if aligned_b else []),
            f"--params={params}",
        ],
        run_id=f"lmclab-connect-{seeds}-{method}",
        nproc_per_node=read("measure.nproc_per_node"),
    )
    world = join_torchrun(resolve_device(read("device")))
    settings = dict(
        seed=read("permute.seed"),
        lams=lambda_grid(read("measure.num_lambdas")),
        resolution=read("three.resolution"),
        margin=read("three.margin"),
        gammas=read("measure.gammas"),
        device=world.device,
        world=world,
    )
    paths = {k: models / f"seed{s}.pt" for k, s in zip("abc", seeds.split(","), strict=True)}
    ckpts = {k: load_checkpoint(p) for k, p in paths.items()}
    for k in "bc":
        check_same_architecture(ckpts["a"], ckpts[k], paths["a"], paths[k])
    aligned = {"b": load_alignment(aligned_b, method)} if aligned_b else {}
    train = load_split(data, "train")
    settings |= repairs(read("measure"), build_model(ckpts["a"].arch, ckpts["a"].config).to(world.device), train, world)
    with params_errors(KEYS, search_key(method)):  # its own arguments first, then the search's options
        result = connect_triple(
            method, ckpts, train, load_split(data, "test"), options=options, aligned=aligned, **settings
        )
    leave_world(world)
    if not world.is_main:  # one writer
        return
    atomic_save(result.perms, out / "perms.pt")
    for name, rows in (("curves", result.curves), ("landscape", result.landscape)):
        write_table(out / f"{name}.parquet", pd.DataFrame(rows))
    write_json(out / "edges.json", {"seeds": seeds, "method": method, "edges": result.edges, "search": result.search})
    bc = next(e for e in result.edges if e["edge"] == "b-c")
    typer.echo(f"{method} {seeds}: b-c test loss barrier {bc['test_loss_barrier_max']:.4f}")


def repairs(measure: dict, model, train, world) -> dict:
    """``repair`` (BN repair) or ``repair_at`` (REPAIR) as the measure stage builds them from ``measure``."""
    from lmclab.core.bn_repair import bn_repair_hook, has_batchnorm, repair_subset
    from lmclab.core.repair import RepairAt

    if measure["bn_repair"] and has_batchnorm(model):
        with params_errors(REPAIR_KEYS["bn_repair"]):
            return {"repair": bn_repair_hook(model, train, num_samples=measure["bn_repair_samples"], world=world)}
    if measure["repair"] and not has_batchnorm(model):
        with params_errors(REPAIR_KEYS["repair"]):
            return {"repair_at": RepairAt(model, repair_subset(train, measure["repair_samples"]))}
    return {}


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
