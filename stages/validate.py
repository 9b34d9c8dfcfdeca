"""Stage validate: check every parameter against the schema (``lmclab.pipeline.schema``) and the checks that
span several keys, before any heavy work; writes a marker file (~3 s). Each bad key is one line
``error: <key>: expected …, got …`` on stderr, and the stage exits 1.

Runs first (download depends on its output) and declares the whole of params.yaml, so a typo'd
key anywhere is caught. Its output never changes while the params are valid, so it does not
trigger reruns downstream."""

from __future__ import annotations

from pathlib import Path

import typer
from _repo_src import DVC_YAML  # first: this repository's src/ on sys.path

from lmclab.pipeline.stage import one_line_errors, run_warm, stage_params

app = typer.Typer(add_completion=False)


@app.command()
@one_line_errors
def main(out: Path = typer.Option(...), params: Path = Path("params.yaml")) -> None:
    from lmclab.core.atomic import write_text
    from lmclab.pipeline.validate import ParamsError, check_params

    try:
        check_params(stage_params("validate", params, dvc_yaml=DVC_YAML)(""))
    except ParamsError as err:
        raise SystemExit("\n".join(f"error: {line}" for line in err.lines)) from None
    write_text(out, "parameters valid\n")


if __name__ == "__main__":
    run_warm(app)
