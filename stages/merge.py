"""Stage merge (one instance per pair and method): apply π to θb and write ``permuted_b.pt``
(π(θb)) and ``midpoint.pt`` ((θa + π(θb))/2), both ordinary checkpoints. ~4 s (imports)."""

from __future__ import annotations

from pathlib import Path

import typer

from common import one_line_errors

app = typer.Typer(add_completion=False)


@app.command()
@one_line_errors
def main(model_a: Path = typer.Option(...), model_b: Path = typer.Option(...),
         perm: Path = typer.Option(...), out: Path = typer.Option(...)) -> None:
    import torch

    from lmclab.archs import get_arch
    from lmclab.checkpoint import Checkpoint, check_same_architecture, load_checkpoint, save_checkpoint
    from lmclab.merge import merge
    from lmclab.spec import check_permutation

    a, b = load_checkpoint(model_a), load_checkpoint(model_b)
    check_same_architecture(a, b, model_a, model_b)
    spec = get_arch(a.arch).permutation_spec(a.config)
    pi = torch.load(perm / "perm.pt", weights_only=True)
    check_permutation(pi, spec.group_sizes(b.state_dict))
    permuted_b, midpoint = merge(spec, a.state_dict, b.state_dict, pi)
    save_checkpoint(out / "permuted_b.pt", Checkpoint(a.arch, a.config, b.seed, permuted_b))
    save_checkpoint(out / "midpoint.pt", Checkpoint(a.arch, a.config, None, midpoint))


if __name__ == "__main__":
    app()
