"""Stage spectra (all trained seeds in one process; never reruns when a permute parameter changes):
singular values of every layer (Figures 1, 7, 8) and the input energy E[(v_iᵀ z_{ℓ−1})²] over the
test split (Figures 4, 9). Writes ``seed<S>/spectrum.parquet`` and ``seed<S>/energy.parquet``.
Default MLP: ~1 s per seed after imports."""

from __future__ import annotations

from pathlib import Path

import typer
from _repo_src import DVC_YAML  # first: this repository's src/ on sys.path

from lmclab.pipeline.stage import one_line_errors, params_errors, run_warm, stage_params, under

app = typer.Typer(add_completion=False)
# the params.yaml key of each argument the library's errors name
KEYS = under("measure", "conv_spectrum")


@app.command()
@one_line_errors
@params_errors(KEYS)  # the library's errors, under their params.yaml keys
def main(
    models: Path = typer.Option(...),
    data: Path = typer.Option(...),
    out: Path = typer.Option(...),
    params: Path = Path("params.yaml"),
) -> None:
    import pandas as pd

    from lmclab.analysis.alignment import check_mode
    from lmclab.analysis.compose import analyze_model
    from lmclab.archs import build_model, get_arch
    from lmclab.archs.checkpoint import load_checkpoint
    from lmclab.core.atomic import write_table
    from lmclab.core.data import load_split
    from lmclab.core.device import resolve_device

    read = stage_params("spectra", params, dvc_yaml=DVC_YAML)
    mode = read("measure.conv_spectrum")
    check_mode(mode)
    device = resolve_device(read("device"))
    test = load_split(data, "test")
    for seed in read("train.seeds"):
        ckpt = load_checkpoint(models / f"seed{seed}.pt")
        spectrum, energy = analyze_model(
            get_arch(ckpt.arch).permutation_spec(ckpt.config),
            build_model(ckpt.arch, ckpt.config).to(device),
            {k: v.to(device) for k, v in ckpt.state_dict.items()},
            test,
            mode=mode,
            input_shape=ckpt.config.input_shape,
        )
        for name, rows in (("spectrum", spectrum), ("energy", energy)):
            write_table(out / f"seed{seed}" / f"{name}.parquet", pd.DataFrame(rows).assign(seed=seed))
        typer.echo(f"seed{seed}: spectra of {pd.DataFrame(spectrum)['layer'].nunique()} layers ({mode})")


if __name__ == "__main__":
    run_warm(app)
