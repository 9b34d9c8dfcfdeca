"""Stage merge_many: map the models of ``merge_many.seeds`` into one frame by every method of
``merge_many.methods`` (MergeMany, C2M3, sync, star) and compare the merges with the references
(each model, the output ensemble, the unaligned average, direct pairwise WM); ``merge_many.repair``
also evaluates each merge repaired. Writes ``evaluation.parquet`` (loss and accuracy per method, model,
repair and split), ``methods.parquet`` (objective, cycle error, mean pairwise barrier, time,
assignments), ``pairwise.parquet`` (the test barrier at λ = ½ of every pair's map), ``trace.json``
(each method's stats, e.g. its objective per iteration) and ``<method>/merged.pt`` with ``perms.pt``
(permutations) or ``transforms.pt`` (CCA Merge and ZipIt!'s merge and unmerge matrices).
4 × MLP 3×512: ~25 s."""

from __future__ import annotations

from pathlib import Path

import typer
from _repo_src import DVC_YAML  # first: this repository's src/ on sys.path

from lmclab.pipeline.stage import method_key, one_line_errors, params_errors, run_warm, stage_params, under

app = typer.Typer(add_completion=False)
# the params.yaml key of each argument the library's errors name
# the pipeline names the models it merges by their trained seeds (lmclab.cli.names: models)
KEYS = {**under("merge_many", "repair", "repair_samples"), "params": "merge_many.seeds", "names": "merge_many.seeds"}


@app.command()
@one_line_errors
def main(
    models: Path = typer.Option(...),
    data: Path = typer.Option(...),
    out: Path = typer.Option(...),
    params: Path = Path("params.yaml"),
) -> None:
    from lmclab.analysis.many_models import compare_many
    from lmclab.archs import build_model, get_arch
    from lmclab.core.bn_repair import repair_subset
    from lmclab.core.data import load_split
    from lmclab.core.device import resolve_device
    from lmclab.search.many_methods import check_many

    read = stage_params("merge_many", params, dvc_yaml=DVC_YAML)
    opts = read("merge_many")
    methods = {m: opts[m] or {} for m in opts["methods"]}
    for method, options in methods.items():  # every bad option before any work, checked once: here
        with params_errors(method_key("merge_many", method)):
            methods[method] = check_many(method, options)
    ckpts = load_models(models, opts["seeds"])
    device, first = resolve_device(read("device")), ckpts[0]
    train = load_split(data, "train")
    with params_errors(KEYS):
        found = compare_many(
            build_model(first.arch, first.config).to(device),
            get_arch(first.arch).permutation_spec(first.config),
            [{k: v.to(device) for k, v in c.state_dict.items()} for c in ckpts],
            [f"seed{c.seed}" for c in ckpts],
            {"train": train, "test": load_split(data, "test")},
            methods=methods,
            seed=read("permute.seed"),
            repair=opts["repair"],
            repair_data=repair_subset(train, opts["repair_samples"]),
            points=get_arch(first.arch).activation_points(first.config),
            train=train,
        )
    write_outputs(found, out, first, {"seeds": opts["seeds"], "repair": opts["repair"]})


def load_models(models: Path, seeds) -> list:
    """The checkpoints of ``seeds`` in ``models``, of one architecture."""
    from lmclab.archs.checkpoint import check_same_architecture, load_checkpoint

    paths = [models / f"seed{s}.pt" for s in seeds]
    ckpts = [load_checkpoint(p) for p in paths]
    for p, c in zip(paths[1:], ckpts[1:], strict=True):
        check_same_architecture(ckpts[0], c, paths[0], p)
    return ckpts


def write_outputs(found, out: Path, first, run: dict) -> None:
    """Each method's merged model and permutations or transforms, the three tables and ``trace.json`` (``run``
    and each method's stats) of a :func:`~lmclab.analysis.many_models.compare_many` result."""
    import pandas as pd

    from lmclab.archs.checkpoint import Checkpoint, atomic_save, save_checkpoint
    from lmclab.core.atomic import write_json, write_table

    for method, result in found.results.items():
        if result.merged is not None:  # a partial zip has one network per model instead
            save_checkpoint(out / method / "merged.pt", Checkpoint(first.arch, first.config, None, result.merged))
        if hasattr(result, "perms"):
            atomic_save([{g: p.cpu() for g, p in perm.items()} for perm in result.perms], out / method / "perms.pt")
        else:  # merge and unmerge matrices per model and group
            atomic_save({"merges": result.merges, "unmerges": result.unmerges}, out / method / "transforms.pt")
    for name, rows in (("evaluation", found.evaluation), ("methods", found.methods), ("pairwise", found.pairwise)):
        write_table(out / f"{name}.parquet", pd.DataFrame(rows))
    write_json(out / "trace.json", {**run, "methods": {m: r.stats for m, r in found.results.items()}})
    for row in found.methods:
        typer.echo(f"{row['method']}: cycle error {row['cycle_error']:.3f}, {row['seconds']:.1f} s")


if __name__ == "__main__":
    run_warm(app)
