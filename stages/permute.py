"""Stage permute (one instance per pair and method): find π aligning θb to θa in the symmetry group
``permute.symmetry`` names (permutations, or orthogonal maps where the tracer proves them, acting on both
models' canonical forms: ``lmclab.archs.canonical``); writes ``perm.pt`` (group -> index tensor, or orthogonal
matrix) and ``stats.json`` (time, sweeps, objective per sweep; for
iterative methods a per-epoch ``curve`` of L2 distance and merged test loss/accuracy).
Default MLP: identity/WM/AM well under a second each after ~4 s of imports; ste, wm_sinkhorn,
ste_sinkhorn take the seconds given in params.yaml."""

from __future__ import annotations

from pathlib import Path

import typer
from _repo_src import DVC_YAML  # first: this repository's src/ on sys.path

from lmclab.pipeline.stage import (
    method_key,
    one_line_errors,
    params_errors,
    run_warm,
    search_errors,
    show_progress,
    stage_params,
    under,
)

app = typer.Typer(add_completion=False)


@app.command()
@one_line_errors
def main(
    method: str = typer.Option(...),
    model_a: Path = typer.Option(...),
    model_b: Path = typer.Option(...),
    data: Path = typer.Option(...),
    out: Path = typer.Option(...),
    params: Path = Path("params.yaml"),
) -> None:
    from lmclab.api import align
    from lmclab.archs import build_model
    from lmclab.archs.canonical import symmetric_forms
    from lmclab.archs.checkpoint import atomic_save, check_same_architecture, load_checkpoint
    from lmclab.core.atomic import write_json
    from lmclab.core.data import load_split
    from lmclab.search import check_method

    read = stage_params("permute", params, dvc_yaml=DVC_YAML, method=method)
    options = read(f"permute.{method}") or {}
    with search_errors(method):  # the library's errors, under their params.yaml keys: checked once, here
        options = check_method(method, options)
    a, b = load_checkpoint(model_a), load_checkpoint(model_b)
    check_same_architecture(a, b, model_a, model_b)
    train, symmetry = load_split(data, "train"), read("permute.symmetry")
    # the checkpoints and the registry's spec, or their canonical forms and the tracer's spec with its kinds
    (a, b), spec, points = symmetric_forms(a, b, symmetry=symmetry, example_inputs=train.x[:2])
    with params_errors(under("permute", "symmetry"), method_key("permute", method)):
        result = align(
            a.state_dict,
            b.state_dict,
            method=method,
            symmetry=symmetry,
            spec=spec,
            model=build_model(a.arch, a.config),
            points=points,
            data=train,
            eval_data=load_split(data, "test"),
            seed=read("permute.seed"),
            device=read("device"),
            progress=show_progress(),
            options=options,
        )
    atomic_save(result.perm, out / "perm.pt")
    write_json(out / "stats.json", {"method": method, **result.stats})
    typer.echo(f"{method}: {model_b.name} -> {model_a.name} in {result.stats['seconds']:.3f} s")


if __name__ == "__main__":
    run_warm(app)
