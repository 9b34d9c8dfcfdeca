"""``lmclab barrier``: the loss and accuracy barriers on the line between A and π(B) (the paper's Definition
2.1), the API's :func:`lmclab.curve` on files."""

from __future__ import annotations

from pathlib import Path

import typer

from lmclab.cli.common import (
    DATA_ROOT,
    DEVICE,
    FACTORY,
    IN_CHANNELS,
    KWARGS,
    PARTIAL,
    PROGRESS,
    REPAIR,
    REPAIR_SAMPLES,
    SHAPE,
    flagged,
    one_line,
)
from lmclab.cli.inputs import aligned_pair, check_inputs, load_data, output_path, parse_samples


@one_line
def barrier(  # size: a typer command's signature lists each of its options
    model_a: Path = typer.Argument(...),
    model_b: Path = typer.Argument(...),
    data: str = typer.Option(..., help="a data set name (mnist5k, cifar10, …) or a prepared data folder"),
    alignment: Path = typer.Option(None, help="an alignment from `lmclab match` (none: the naive pair)"),
    split: str = typer.Option("test", help="train or test"),
    num_lambdas: int = typer.Option(11, help="evenly spaced λ values in [0, 1] (½ added if missing)"),
    repair: str = REPAIR,
    repair_samples: str = REPAIR_SAMPLES,
    data_root: Path = DATA_ROOT,
    in_channels: int = IN_CHANNELS,
    factory: str = FACTORY,
    kwargs: str = KWARGS,
    input_shape: str = SHAPE,
    json_out: Path = typer.Option(None, "--json", help="also write every barrier as JSON (accuracies as fractions)"),
    device: str = DEVICE,
    partial: bool = PARTIAL,
    progress: bool = PROGRESS,
) -> None:
    """Loss and accuracy barriers on the line between A and π(B)."""
    from lmclab.api import curve as measure_curve
    from lmclab.core.atomic import write_json
    from lmclab.core.metrics import lambda_grid
    from lmclab.core.repairs import check_repair, resolved_repair

    if json_out is not None:
        output_path(json_out, "--json")
    if split not in ("train", "test"):
        raise ValueError(f"--split: expected train or test, got {split!r}")
    with flagged():
        lambda_grid(num_lambdas)
        check_repair(repair)
    params_a, params_b, net = aligned_pair(model_a, model_b, alignment, factory, kwargs, input_shape, partial)
    with flagged():
        resolved_repair(repair, net)
    test = load_data(data, split, data_root, in_channels)
    check_inputs(net, params_a, test, data)
    repair_data = load_data(data, "train", data_root, in_channels) if repair != "none" else None
    curve = measure_curve(
        params_a,
        params_b,
        model=net,
        eval_data={split: test},
        num_lambdas=num_lambdas,
        repair=repair,
        repair_data=repair_data,
        repair_samples=parse_samples(repair_samples),
        device=device,
        progress=progress,
    )
    found = curve.barriers()  # accuracy in per cent, its barriers in percentage points
    for q, unit, gap in (("loss", "mean cross-entropy", ""), ("acc", "%", " points")):
        typer.echo(
            f"{split} {q} ({unit}): A {found[f'{split}_{q}_a']:.4f}, B {found[f'{split}_{q}_b']:.4f}, "
            f"midpoint {found[f'{split}_{q}_mid']:.4f}; barrier max {found[f'{split}_{q}_barrier_max']:.4f}"
            f"{gap}, mid {found[f'{split}_{q}_barrier_mid']:.4f}{gap}"
        )
    if json_out is not None:  # one unit in the file: accuracies as fractions, as in the curve's rows
        fractions = {k: v / 100 if k.startswith(f"{split}_acc_") else v for k, v in found.items()}
        write_json(json_out, {"barriers": fractions, "curve": curve.rows})
