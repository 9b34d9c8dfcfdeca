"""Stage merge (one instance per pair and method): apply π to θb and write ``permuted_b.pt``
(π(θb)) and ``midpoint.pt`` ((θa + π(θb))/2), both ordinary checkpoints. With
``measure.bn_repair`` and a BatchNorm architecture, the midpoint's running statistics are
repaired on ``measure.bn_repair_samples`` training images. ~4 s (imports) plus the repair."""

from __future__ import annotations

from pathlib import Path

import typer

from common import one_line_errors, read_params

app = typer.Typer(add_completion=False)


@app.command()
@one_line_errors
def main(model_a: Path = typer.Option(...), model_b: Path = typer.Option(...),
         perm: Path = typer.Option(...), data: Path = typer.Option(...),
         out: Path = typer.Option(...), params: Path = Path("params.yaml")) -> None:
    import torch

    from lmclab.archs import build_model, get_arch
    from lmclab.bn_repair import bn_repair_hook, has_batchnorm
    from lmclab.checkpoint import Checkpoint, check_same_architecture, load_checkpoint, save_checkpoint
    from lmclab.data import load_split
    from lmclab.merge import merge
    from lmclab.spec import check_permutation

    a, b = load_checkpoint(model_a), load_checkpoint(model_b)
    check_same_architecture(a, b, model_a, model_b)
    spec = get_arch(a.arch).permutation_spec(a.config)
    pi = torch.load(perm / "perm.pt", weights_only=True)
    check_permutation(pi, spec.group_sizes(b.state_dict))
    permuted_b, midpoint = merge(spec, a.state_dict, b.state_dict, pi)
    model = build_model(a.arch, a.config)
    if read_params(params, "measure.bn_repair") and has_batchnorm(model):
        midpoint = bn_repair_hook(model, load_split(data, "train"),
                                  num_samples=read_params(params, "measure.bn_repair_samples"))(midpoint)
    save_checkpoint(out / "permuted_b.pt", Checkpoint(a.arch, a.config, b.seed, permuted_b))
    save_checkpoint(out / "midpoint.pt", Checkpoint(a.arch, a.config, None, midpoint))


if __name__ == "__main__":
    app()
