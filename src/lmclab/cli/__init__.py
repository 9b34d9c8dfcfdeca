"""The ``lmclab`` command: the public API (:mod:`lmclab.api`) on model files, from a shell.

    lmclab match A B --method wm [--factory pkg.mod:fn --kwargs '{…}'] --out perm.pt
    lmclab merge A B [--alignment perm.pt] [--lam 0.5] --out merged.pt
    lmclab merge-many A B C … --method c2m3 [--data …] [--repair auto] --out merged.safetensors
    lmclab barrier A B [--alignment perm.pt] --data mnist5k|cifar10|PREPARED_DIR
    lmclab trace pkg.mod:fn --input-shape 3,32,32
    lmclab validate params.yaml

A and B are plain state dicts (``.pt``/``.pth``/``.safetensors``; the module comes from
``--factory``), Hugging Face checkpoint folders (``config.json`` and weights; their config builds the
module, ``merge`` writes such a folder) or lmclab checkpoints (which carry their architecture). Bad input is one line on
stderr and exit status 1."""

from __future__ import annotations

from lmclab.core.threads import wait_briefly

wait_briefly()  # the command's thread policy: OpenMP reads it when torch loads, below (lmclab.core.threads)

from pathlib import Path

import typer

from lmclab.cli import barrier, models, preset, studies
from lmclab.cli.common import KWARGS, SYMMETRY, one_line
from lmclab.cli.inputs import parse_kwargs, parse_shape, trace_inputs

HELP = (
    "Align, merge and measure trained networks from the shell: match finds the permutation of B's hidden "
    "units that aligns it to A, merge and merge-many write merged weights, barrier measures the loss and "
    "accuracy barriers on the line between A and π(B) (linear mode connectivity)."
)
app = typer.Typer(add_completion=False, no_args_is_help=True, help=HELP)


@app.callback()
def threads(
    threads: str = typer.Option(
        "auto", envvar="LMCLAB_THREADS", help="intra-op threads: auto (lmclab.core.threads) or a count"
    ),
) -> None:
    """The thread policy for the command's process, before any command runs."""
    from lmclab.core.threads import use_threads

    try:
        use_threads(threads)
    except ValueError as exc:  # "threads: …", named as the option
        typer.echo(f"error: --{exc}", err=True)
        raise typer.Exit(1) from None


@one_line
def trace(
    factory: str = typer.Argument(..., help="module:callable building the nn.Module"),
    input_shape: str = typer.Option(..., help="input shape without the batch axis, e.g. 3,32,32"),
    kwargs: str = KWARGS,
    partial: bool = typer.Option(False, help="leave what cannot be proven unpermuted"),
    symmetry: str = SYMMETRY,
) -> None:
    """Print the permutation spec tracing derives (groups, their sizes, kinds and places; what it left
    unpermuted, where and why; why a group's kind is narrower; the norm gains an orthogonal map needs folded),
    or the refusal."""
    from lmclab.api.files import build_factory
    from lmclab.trace import trace as trace_model

    net = build_factory(factory, parse_kwargs(kwargs))
    inputs = trace_inputs(net, parse_shape(input_shape))  # a transformers model's token ids, else zeros
    traced = trace_model(net, inputs, partial=partial, symmetry=symmetry)
    sizes = traced.spec.group_sizes(net.state_dict())
    for group, places in traced.spec.groups.items():
        where = ", ".join(f"{name}[{axis}]{_copies(traced.spec.axes[name][axis], group)}" for name, axis in places)
        heads = traced.spec.heads.get(group)
        headed = f"; {heads.count} heads, head order {heads.tie}" if heads else ""
        kind = f", {traced.spec.kinds[group]}" if group in traced.spec.kinds else ""
        typer.echo(f"{group} ({sizes[group]} units{kind}{headed}): {where}")
    for pin in traced.spec.pinned:  # what the trace left unpermuted, and why (lmclab.trace.pinned)
        where = ", ".join(f"{name}[{axis}]" for name, axis in pin.places[:4]) + ", …" * (len(pin.places) > 4)
        stream = ", a residual stream" if pin.stream else ""
        typer.echo(f"pinned: {pin.units} units{stream} by node {pin.node!r} in {pin.where} ({pin.reason}): {where}")
    for group, reason in traced.spec.kind_reasons.items():  # why a group takes no orthogonal map (or a narrower one)
        narrower = {"centred": "is centred", "rotary": "is rotary"}.get(
            traced.spec.kinds.get(group), "stays a permutation group"
        )
        typer.echo(f"kind: {group} {narrower}: {reason}")
    for gain, readers in traced.spec.gains.items():  # folded before an orthogonal map (lmclab.core.canonical)
        typer.echo(f"gain: {gain} folded into {', '.join(readers)}")
    typer.echo(f"{len(sizes)} groups over {len(traced.spec.axes)} tensors")


@one_line
def validate(params: Path = typer.Argument(Path("params.yaml"), help="a params.yaml of the pipeline")) -> None:
    """Check a params.yaml against the pipeline's schema: one line per bad key."""
    from lmclab.pipeline.stage import load_yaml
    from lmclab.pipeline.validate import ParamsError, check_params

    try:
        check_params(load_yaml(params) or {})
    except ParamsError as err:
        typer.echo("\n".join(f"error: {line}" for line in err.lines), err=True)
        raise typer.Exit(1) from None
    typer.echo(f"{params}: valid")


# the commands on model files (cli/models.py, cli/barrier.py), then on a spec and on the params, in this order
for name, command in [("match", models.match), ("merge", models.merge), ("merge-many", models.merge_many)]:
    app.command(name)(command)
for name, command in [("barrier", barrier.barrier), ("trace", trace), ("validate", validate)]:
    app.command(name)(command)
app.add_typer(studies.app, name="study")  # lmclab study NAME: the studies over finished runs (cli/studies/)
app.command("preset")(preset.preset)  # lmclab preset NAME: a paper preset into params.yaml (cli/preset.py)


def main() -> None:
    app()


def _copies(entry: object, group: str) -> str:
    """`` (2 copies)`` where an axis holds ``group``'s units more than once (grouped queries' W_Q rows)."""
    counts = [s.copies for s in entry if s.group == group] if isinstance(entry, tuple) else [1]
    return f" ({max(counts)} copies)" if max(counts) > 1 else ""
