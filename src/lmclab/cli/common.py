"""What the ``lmclab`` commands share: the options several of them take (each named as its API keyword and
params.yaml key, :mod:`lmclab.cli.names`) and the one-line report of bad input."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
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
SYMMETRY = typer.Option(
    "permutation", help="permutation, or orthogonal: orthogonal maps of the groups the tracer proves (method wm)"
)
STREAM = typer.Option(
    None,
    "--stream/--no-stream",
    help="read two HF folders of safetensors one tensor at a time (weight matching; default: from 256 MiB)",
)
PARTIAL = typer.Option(False, help="trace: leave the channels it cannot prove unpermuted instead of refusing")
REPAIR = typer.Option(
    "none",
    help="none, bn (BatchNorm statistics), repair (REPAIR) or auto (the one the net takes), on --data's train split",
)
DATA_ROOT = typer.Option(Path("data/raw"), help="torchvision's download/cache folder")
IN_CHANNELS = typer.Option(None, help="repeat the data's channels to this many")
OPTION = typer.Option([], help="a method option key=value (repeatable)")
REPAIR_SAMPLES = typer.Option("500", help="training samples of the repair's statistics, or all")


def flagged() -> AbstractContextManager[None]:
    """The library's checks of an API keyword (an :class:`lmclab.core.options.OptionError`) reported with the
    command's option for it (:func:`lmclab.cli.names.flag_of`: ``num_lambdas`` → ``--num-lambdas``)."""
    from lmclab.cli.names import flag_of
    from lmclab.core.options import keyed_errors

    return keyed_errors(flag_of)


def one_line(fn: Callable) -> Callable:
    """Bad input (ValueError, TypeError, FileNotFoundError, a refused trace) as ``error: …``, exit 1; a traced
    spec's :class:`~lmclab.trace.PinnedWarning` as ``warning: …`` (:func:`pinned_in_one_line`)."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from lmclab.trace import TraceError

        try:
            with pinned_in_one_line():  # lmclab match, merge-many: what a traced spec leaves unpermuted
                return fn(*args, **kwargs)
        except (ValueError, TypeError, FileNotFoundError, TraceError) as exc:
            line = str(exc).splitlines()[0].replace("pass partial=True", "pass --partial")
            typer.echo(f"error: {line}", err=True)
            raise typer.Exit(1) from None

    return wrapper


@contextmanager
def pinned_in_one_line() -> Iterator[None]:
    """A traced spec's :class:`~lmclab.trace.PinnedWarning` (:mod:`lmclab.trace.pinned`) shown as one line
    ``warning: …`` on stderr; other warnings as Python shows them."""
    from lmclab.trace import PinnedWarning

    shown = warnings.showwarning

    def show(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> None:
        if issubclass(category, PinnedWarning):
            typer.echo(f"warning: {message}", err=True)
        else:
            shown(message, category, *args, **kwargs)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = shown
