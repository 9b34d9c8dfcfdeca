"""Stage merge_many: align the models of ``merge_many.seeds`` to each other (MergeMany) and
compare the average with the output ensemble and each model. Writes ``merged.pt``, ``perms.pt``,
``trace.json`` (summed distance per iteration) and ``evaluation.parquet``. 4 × MLP 3×512: ~15 s."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from _repo_src import DVC_YAML  # first: this repository's src/ on sys.path

from lmclab.pipeline.stage import one_line_errors, params_errors, run_warm, stage_params, under

app = typer.Typer(add_completion=False)
# the params.yaml key of each argument the library's errors name
KEYS = under("merge_many", "max_iter", "tol", params="seeds")


@app.command()
@one_line_errors
@params_errors(KEYS)  # the library's errors, under their params.yaml keys
def main(
    models: Path = typer.Option(...),
    data: Path = typer.Option(...),
    out: Path = typer.Option(...),
    params: Path = Path("params.yaml"),
) -> None:
    import pandas as pd

    from lmclab.analysis.ensemble import merge_and_compare
    from lmclab.archs.checkpoint import (
        Checkpoint,
        atomic_save,
        check_same_architecture,
        load_checkpoint,
        save_checkpoint,
    )
    from lmclab.core.atomic import atomic_path
    from lmclab.core.data import load_split
    from lmclab.core.device import resolve_device

    read = stage_params("merge_many", params, dvc_yaml=DVC_YAML)
    opts = read("merge_many")
    paths = [models / f"seed{s}.pt" for s in opts["seeds"]]
    ckpts = [load_checkpoint(p) for p in paths]
    for p, c in zip(paths[1:], ckpts[1:], strict=True):
        check_same_architecture(ckpts[0], c, paths[0], p)
    result, rows = merge_and_compare(
        ckpts,
        {"train": load_split(data, "train"), "test": load_split(data, "test")},
        max_iter=opts["max_iter"],
        tol=opts["tol"],
        seed=read("permute.seed"),
        device=resolve_device(read("device")),
    )
    save_checkpoint(out / "merged.pt", Checkpoint(ckpts[0].arch, ckpts[0].config, None, result.merged))
    atomic_save([{g: p.cpu() for g, p in perm.items()} for perm in result.perms], out / "perms.pt")
    with atomic_path(out / "evaluation.parquet") as tmp:
        pd.DataFrame(rows).to_parquet(tmp, index=False)
    with atomic_path(out / "trace.json") as tmp:
        tmp.write_text(json.dumps({"seeds": opts["seeds"], **result.stats}, indent=2) + "\n")
    quantity = "acc" if all(r["acc"] == r["acc"] for r in rows) else "loss"  # NaN: a reconstruction model
    test = {r["model"]: r[quantity] for r in rows if r["split"] == "test"}
    typer.echo(
        f"MergeMany of {len(ckpts)}: test {quantity} {test['MergeMany average']:.4f}, "
        f"ensemble {test['ensemble']:.4f}, naive average {test['naive average']:.4f}"
    )


if __name__ == "__main__":
    run_warm(app)
