"""Why Sinkhorn WM (DistL2) at lr 1 finds no alignment for wide models: the gradient of its mean loss
at the start, against Adam's ε (:func:`lmclab.search.wm_sinkhorn.start_gradients`).

    python tools/sinkhorn_gradients.py --pair 'data/models/seed0.pt data/models/seed2.pt' \\
        --pair '<width-2048 run>/data/models/seed0.pt <width-2048 run>/data/models/seed2.pt'

writes one row per pair and permutation group (the checkpoints' width, the N matched entries, the
gradient's RMS and largest entry, RMS/ε, the RMS of Adam's first step at lr 1) to
``reports/three_study/wm_sinkhorn_gradients.json`` (``--out``). The three-model study's width points
train their models (``dvc exp``, ``lmclab study three``); their checkpoints are the pairs to give.
"""

from __future__ import annotations

import platform
from pathlib import Path

import torch
import typer

from lmclab.pipeline.stage import one_line_errors

app = typer.Typer(add_completion=False)


@app.command()
@one_line_errors
def main(
    pair: list[str] = typer.Option(..., help="two checkpoints 'A B' (θa, θb), quoted as one value; repeatable"),
    out: Path = typer.Option(Path("reports/three_study/wm_sinkhorn_gradients.json")),
    seed: int = typer.Option(0, help="the search's seed (permute.seed): the start scores' noise"),
) -> None:
    """One row per pair and group; written atomically."""
    from lmclab.archs import get_arch
    from lmclab.archs.checkpoint import check_same_architecture, load_checkpoint
    from lmclab.core.atomic import write_json
    from lmclab.search.wm_sinkhorn import ADAM_EPS, start_gradients

    rows = []
    for a_path, b_path in _pairs(pair):
        a, b = load_checkpoint(a_path), load_checkpoint(b_path)
        check_same_architecture(a, b, a_path, b_path)
        spec = get_arch(a.arch).permutation_spec(a.config)
        entries = sum(v.numel() for v in spec.matched(b.state_dict).values())
        found = start_gradients(spec, a.state_dict, b.state_dict, generator=torch.Generator().manual_seed(seed))
        for group, numbers in found.items():
            rows.append(
                {"a": a_path.name, "b": b_path.name, "arch": a.arch, "entries": entries, "group": group, **numbers}
            )
            typer.echo(f"{a.arch} width {numbers['n']} {group}: RMS gradient {numbers['rms_over_eps']:.2g}·ε")
    blob = {"adam_eps": ADAM_EPS, "seed": seed, "machine": platform.machine(), "torch": torch.__version__, "rows": rows}
    write_json(out, blob)


def _pairs(values: list[str]) -> list[tuple[Path, Path]]:
    """``--pair 'A B'`` options as (A, B) paths; a value that is not two paths is a one-line error."""
    pairs = []
    for value in values:
        parts = value.split()
        if len(parts) != 2:
            raise ValueError(f"--pair: expected two checkpoint paths 'A B', got {value!r}")
        pairs.append((Path(parts[0]), Path(parts[1])))
    return pairs


if __name__ == "__main__":
    app()
