"""Apply a named paper preset (presets/NAME.yaml) to params.yaml, in a checkout of the pipeline (not a DVC
stage).

    lmclab preset cifar10_resnet20                 # rewrite params.yaml in place
    lmclab preset cifar10_resnet20 --set-params    # print `dvc exp run -S` flags instead
    lmclab preset --list                           # the presets of presets/

Only values change: every other line, comment and key order of params.yaml is kept. Each preset
key must already exist in params.yaml (a typo is an error, not a new key); the result is
validated like the validate stage before it is written (atomically); a local corpus or tokenizer folder it
names that is not there yet (``data.root``, ``data.tokenizer``) is a note, not an error.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import typer

from lmclab.pipeline.stage import one_line_errors

PRESETS = Path("presets")


def _help() -> str:
    """The command's help, with the presets of ./presets when there is such a folder."""
    from lmclab.pipeline.preset import preset_names

    text = __doc__.split("\n\n")[0].replace("\n", " ")
    names = preset_names(PRESETS) if PRESETS.is_dir() else []
    return text + (f"\n\nPresets in {PRESETS}/: {', '.join(names)}." if names else "")


def _check(name: str, new_text: str, params: Path) -> None:
    """Validate the written params; a corpus or tokenizer the user places before running is a note."""
    from lmclab.pipeline.preset import LOCAL_FILES
    from lmclab.pipeline.stage import parse_yaml
    from lmclab.pipeline.validate import ParamsError, check_params

    try:
        check_params(parse_yaml(new_text, params))
    except ParamsError as err:
        wrong = [line for line in err.lines if not line.startswith(LOCAL_FILES)]
        if wrong:
            raise SystemExit("\n".join(f"error: preset {name}: {line}" for line in wrong)) from None
        for line in err.lines:  # said, not refused
            typer.echo(f"note: preset {name}: {line} (place it there before dvc repro)", err=True)


@one_line_errors
def preset(
    name: str = typer.Argument("", help="the preset: presets/NAME.yaml"),
    params: Path = typer.Option(Path("params.yaml"), help="the params.yaml to rewrite"),
    presets: Path = typer.Option(PRESETS, help="the folder of presets"),
    set_params: bool = typer.Option(False, help="print `dvc exp run -S` flags, change nothing"),
    list_: bool = typer.Option(False, "--list", help="print the presets' names, change nothing"),
) -> None:
    from lmclab.core.atomic import write_text
    from lmclab.pipeline.preset import apply_preset, flow, preset_names, preset_values

    if list_:
        typer.echo("\n".join(preset_names(presets)))
        return
    if not name:
        raise ValueError(f"NAME: give a preset (known: {preset_names(presets)})")
    if not params.is_file():
        raise FileNotFoundError(f"--params: {params}: no such file (run in a checkout of the pipeline)")
    new_text = apply_preset(name, params.read_text(), presets)
    _check(name, new_text, params)
    if set_params:
        overrides = preset_values(name, presets)
        typer.echo("dvc exp run " + " ".join(f"-S {shlex.quote(f'{k}={flow(v)}')}" for k, v in overrides.items()))
        return
    write_text(params, new_text)
    typer.echo(f"{params}: applied preset {name}")


preset.__doc__ = _help()
