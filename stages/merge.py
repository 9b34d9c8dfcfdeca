"""Stage merge (one instance per pair, every method of ``permute.methods``): apply each π to θb (with
``permute.symmetry: orthogonal``, to θb's canonical form, ``lmclab.archs.canonical``) and
write ``<method>/permuted_b.pt`` (π(θb)) and ``<method>/midpoint.pt`` ((θa + π(θb))/2), both
ordinary checkpoints. With ``measure.repair`` (``lmclab.core.repairs``) the midpoint is repaired on
``measure.repair_samples`` training images: ``bn``, its BatchNorm running statistics recomputed; ``repair``,
REPAIR's θ(½) (``lmclab.core.repair``), so the analyses of the measure stage (R_γ, CKA, Taylor terms) see the
repaired merge.
One process per pair (not per method) because each python stage pays ~3 s of imports; the
measure stages depend on their own method's folder only. ~4 s plus the repairs."""

from __future__ import annotations

from pathlib import Path

import typer
from _repo_src import DVC_YAML  # first: this repository's src/ on sys.path

from lmclab.pipeline.stage import one_line_errors, params_errors, run_warm, stage_params, under

app = typer.Typer(add_completion=False)
KEYS = under("measure", "repair", "repair_samples")  # the params.yaml key of each argument the library's errors name


@app.command()
@one_line_errors
@params_errors(KEYS)  # the library's errors, under their params.yaml keys
def main(
    model_a: Path = typer.Option(...),
    model_b: Path = typer.Option(...),
    perms: Path = typer.Option(...),
    data: Path = typer.Option(...),
    out: Path = typer.Option(...),
    params: Path = Path("params.yaml"),
) -> None:
    import torch

    from lmclab.archs import build_model
    from lmclab.archs.canonical import symmetric_forms
    from lmclab.archs.checkpoint import Checkpoint, check_same_architecture, load_checkpoint, save_checkpoint
    from lmclab.core.data import load_split
    from lmclab.core.merge import aligned_midpoint
    from lmclab.core.repairs import curve_repairs
    from lmclab.core.spec import check_permutation

    read = stage_params("merge", params, dvc_yaml=DVC_YAML)
    a, b = load_checkpoint(model_a), load_checkpoint(model_b)
    check_same_architecture(a, b, model_a, model_b)
    symmetry, kind = read("permute.symmetry"), read("measure.repair")
    train = load_split(data, "train") if kind != "none" or symmetry != "permutation" else None  # read if used
    inputs = train.x[:2] if train is not None else None
    (a, b), spec, _ = symmetric_forms(a, b, symmetry=symmetry, example_inputs=inputs)
    model = build_model(a.arch, a.config)
    repair, repair_at = curve_repairs(kind, model, train, repair_samples=read("measure.repair_samples"))
    for method in read("permute.methods"):
        pi = torch.load(perms / method / "perm.pt", weights_only=True)
        check_permutation(pi, spec.group_sizes(b.state_dict), spec.heads, spec.kinds)
        permuted_b, midpoint = aligned_midpoint(spec, a.state_dict, b.state_dict, pi)
        if repair is not None:
            midpoint = repair(midpoint)
        elif repair_at is not None:  # REPAIR's θ(½) = (θa + π(θb))/2 with its units' statistics repaired
            midpoint = repair_at(a.state_dict, permuted_b, 0.5)
        save_checkpoint(out / method / "permuted_b.pt", Checkpoint(a.arch, a.config, b.seed, permuted_b))  # a's form
        save_checkpoint(out / method / "midpoint.pt", Checkpoint(a.arch, a.config, None, midpoint))


if __name__ == "__main__":
    run_warm(app)
