"""What the ``lmclab`` commands share: the options several of them take (each named as its API keyword and
params.yaml key, :mod:`lmclab.cli.names`) and the one-line report of bad input."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any

import typer

FACTORY = typer.Option(None, help="module:callable building the nn.Module of plain state dicts")
KWARGS = typer.Option("{}", help="JSON keyword arguments of --factory")
SHAPE = typer.Option(None, help="input shape without the batch axis, e.g. 3,32,32 (to trace the spec)")
DEVICE = typer.Option("auto", help="auto (a GPU when present), cpu or cuda[:N]")
OUT_MERGED = typer.Option(..., help="the merged state dict (.pt or .safetensors); a new folder for HF folders")
PROGRESS = typer.Option(False, help="show a progress bar on stderr (search steps, curve λ values)")
PARTIAL = typer.Option(False, help="trace: leave the channels it cannot prove unpermuted instead of refusing")
REPAIR = typer.Option(
    "none",
    help="none, bn (BatchNorm statistics), repair (REPAIR) or auto (the one the net takes), on --data's train split",
)
DATA_ROOT = typer.Option(Path("data/raw"), help="torchvision's download/cache folder")
IN_CHANNELS = typer.Option(None, help="repeat the data's channels to this many")
OPTION = typer.Option([], help="a method option key=value (repeatable)")
REPAIR_SAMPLES = typer.Option("500", help="training samples of the repair's statistics, or all")


def one_line(fn: Callable) -> Callable:
    """Bad input (ValueError, TypeError, FileNotFoundError, a refused trace) as ``error: …``, exit 1."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from lmclab.trace import TraceError

        try:
            return fn(*args, **kwargs)
        except (ValueError, TypeError, FileNotFoundError, TraceError) as exc:
            line = str(exc).splitlines()[0].replace("pass partial=True", "pass --partial")
            typer.echo(f"error: {line}", err=True)
            raise typer.Exit(1) from None

    return wrapper


def warn_if_classes_differ(net: Any, params: dict, data: Any) -> None:
    """One line on stderr when the model's outputs are not ``--data``'s classes (torchvision's 1000-way
    head measured on 10-class digits: its accuracy counts every other output as a wrong answer)."""
    import torch
    from torch.func import functional_call

    if net is None or data is None or getattr(data, "x", None) is None or data.y.dtype.is_floating_point:
        return
    was = net.training
    try:
        with torch.no_grad():
            out = functional_call(net.eval(), params, (data.x[:2],))
    except Exception:  # noqa: BLE001 -- the measurement itself reports a model that does not run
        return
    finally:
        net.train(was)
    classes = int(data.y.max()) + 1
    if isinstance(out, torch.Tensor) and out.ndim == 2 and out.shape[1] != classes:
        typer.echo(
            f"warning: the model has {out.shape[1]} outputs and --data {classes} classes; accuracy counts "
            f'every other output as a wrong answer (a {classes}-way head: e.g. --kwargs \'{{"num_classes": '
            f"{classes}}}')",
            err=True,
        )
