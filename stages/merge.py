"""Stage merge (one instance per pair, every method of ``permute.methods``): apply each π to θb and
write ``<method>/permuted_b.pt`` (π(θb)) and ``<method>/midpoint.pt`` ((θa + π(θb))/2), both
ordinary checkpoints. With ``measure.bn_repair`` and a BatchNorm architecture, the midpoint's
running statistics are repaired on ``measure.bn_repair_samples`` training images; with ``measure.repair``
and an architecture without BatchNorm, the midpoint is REPAIR's θ(½) on ``measure.repair_samples``
(``lmclab.core.repair``), so the analyses of the measure stage (R_γ, CKA, Taylor terms) see the
repaired merge.
One process per pair (not per method) because each python stage pays ~3 s of imports; the
measure stages depend on their own method's folder only. ~4 s plus the repairs."""

from __future__ import annotations

from pathlib import Path

import typer
from _repo_src import DVC_YAML  # first: this repository's src/ on sys.path

from lmclab.pipeline.stage import one_line_errors, params_errors, run_warm, stage_params

app = typer.Typer(add_completion=False)
# the params.yaml key of each argument the library's errors name
KEYS = {"num_samples": "measure.bn_repair_samples"}
REPAIR_KEYS = {"num_samples": "measure.repair_samples"}


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

    from lmclab.archs import build_model, get_arch
    from lmclab.archs.checkpoint import Checkpoint, check_same_architecture, load_checkpoint, save_checkpoint
    from lmclab.core.bn_repair import bn_repair_hook, has_batchnorm, repair_subset
    from lmclab.core.data import load_split
    from lmclab.core.merge import aligned_midpoint
    from lmclab.core.repair import RepairAt
    from lmclab.core.spec import check_permutation

    read = stage_params("merge", params, dvc_yaml=DVC_YAML)
    a, b = load_checkpoint(model_a), load_checkpoint(model_b)
    check_same_architecture(a, b, model_a, model_b)
    spec = get_arch(a.arch).permutation_spec(a.config)
    model = build_model(a.arch, a.config)
    repair, repair_at = None, None
    if read("measure.bn_repair") and has_batchnorm(model):
        repair = bn_repair_hook(model, load_split(data, "train"), num_samples=read("measure.bn_repair_samples"))
    elif read("measure.repair") and not has_batchnorm(model):
        with params_errors(REPAIR_KEYS):
            repair_at = RepairAt(model, repair_subset(load_split(data, "train"), read("measure.repair_samples")))
    for method in read("permute.methods"):
        pi = torch.load(perms / method / "perm.pt", weights_only=True)
        check_permutation(pi, spec.group_sizes(b.state_dict), spec.heads)
        permuted_b, midpoint = aligned_midpoint(spec, a.state_dict, b.state_dict, pi)
        if repair is not None:
            midpoint = repair(midpoint)
        elif repair_at is not None:  # REPAIR's θ(½) = (θa + π(θb))/2 with its units' statistics repaired
            midpoint = repair_at(a.state_dict, permuted_b, 0.5)
        save_checkpoint(out / method / "permuted_b.pt", Checkpoint(a.arch, a.config, b.seed, permuted_b))
        save_checkpoint(out / method / "midpoint.pt", Checkpoint(a.arch, a.config, None, midpoint))


if __name__ == "__main__":
    run_warm(app)
