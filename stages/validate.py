"""Stage validate: check every parameter before any heavy work; writes a marker file (~3 s).

Runs first (download depends on its output). Its output never changes while the params are
valid, so it does not trigger reruns downstream."""

from __future__ import annotations

from pathlib import Path

import typer

from common import one_line_errors, read_params, run_warm

app = typer.Typer(add_completion=False)


@app.command()
@one_line_errors
def main(out: Path = typer.Option(...), params: Path = Path("params.yaml")) -> None:
    from lmclab.atomic import atomic_path
    from lmclab.validate import check_params

    check_params(
        data=read_params(params, "data"), model=read_params(params, "model"),
        train=read_params(params, "train"), permute=read_params(params, "permute"),
        measure=read_params(params, "measure"), device=read_params(params, "device"),
        three=read_params(params, "three"), merge_many=read_params(params, "merge_many"))
    with atomic_path(out) as tmp:
        tmp.write_text("parameters valid\n")


if __name__ == "__main__":
    run_warm(app)
