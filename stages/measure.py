"""Stage measure (one instance per pair, every method of ``permute.methods``): everything measured
on θa and each π(θb) (with ``permute.symmetry: orthogonal``, on both canonical forms:
``lmclab.archs.canonical``). Loss/accuracy along θ(λ) on train and test (BatchNorm nets: with stale and
with repaired statistics at every λ), barriers, L2 distances; the Taylor-approximated barrier
(Thm 3.1) on ``measure.taylor_splits``, R_γ (Thm 4.1) and the Theorem 4.2 bound; with ``measure.repair``, the
curves of nets without BatchNorm also with REPAIR (``lmclab.core.repair``). Writes
``<method>/{curve,taylor,theorem42,cka}.parquet`` and ``<method>/summary.json`` (MAE endpoints also
``mae.parquet`` and ``residual.parquet``: ``lmclab.analysis.mae_pair``). One process per pair
(each python stage pays ~3 s of imports). Default MLP: ~5 s per method. With
``measure.nproc_per_node > 1`` it relaunches itself under torchrun: the curves' evaluation and BN repair
are sharded over the processes (the analyses are computed by each), rank 0 writes."""

from __future__ import annotations

from pathlib import Path

import typer
from _repo_src import DVC_YAML  # first: this repository's src/ on sys.path

from lmclab.pipeline.stage import one_line_errors, params_errors, run_warm, show_progress, stage_params, under
from lmclab.pipeline.torchrun import join_torchrun, relaunch_under_torchrun

app = typer.Typer(add_completion=False)
# the params.yaml key of each name the library's errors use: MeasureSettings' fields, and the arguments they feed
SETTINGS = ("num_lambdas", "conv_spectrum", "repair", "repair_data", "repair_samples", "train_samples", "gammas")
SETTINGS += ("calibrate_temperature", "circuits", "family_barriers")
KEYS = under("measure", *SETTINGS)


@app.command()
@one_line_errors
@params_errors(KEYS)  # the library's errors, under their params.yaml keys
def main(
    seed_a: int = typer.Option(...),
    seed_b: int = typer.Option(...),
    model_a: Path = typer.Option(...),
    model_b: Path = typer.Option(...),
    merged: Path = typer.Option(...),
    data: Path = typer.Option(...),
    out: Path = typer.Option(...),
    params: Path = Path("params.yaml"),
) -> None:
    import pandas as pd
    from tqdm import tqdm

    from lmclab.analysis.pair import MeasureSettings, measure_method, prepare_pair
    from lmclab.archs.canonical import symmetric_forms
    from lmclab.archs.checkpoint import load_checkpoint
    from lmclab.core.atomic import write_json, write_table
    from lmclab.core.data import load_split
    from lmclab.core.device import resolve_device
    from lmclab.core.distributed import leave_world

    read = stage_params("measure", params, dvc_yaml=DVC_YAML)
    opts = read("measure")
    named = dict(
        seed_a=seed_a, seed_b=seed_b, model_a=model_a, model_b=model_b, merged=merged, data=data, out=out, params=params
    )
    args = [f"--{k.replace('_', '-')}={v}" for k, v in named.items()]
    run_id = f"lmclab-measure-{seed_a}-{seed_b}"
    relaunch_under_torchrun(__file__, args, run_id=run_id, nproc_per_node=opts["nproc_per_node"])
    settings = MeasureSettings.of(opts)
    world = join_torchrun(resolve_device(read("device")))
    splits = {"train": load_split(data, "train"), "test": load_split(data, "test")}
    ends = (load_checkpoint(model_a), load_checkpoint(model_b))
    forms, _, _ = symmetric_forms(*ends, symmetry=read("permute.symmetry"), example_inputs=splits["train"].x[:2])
    pair = prepare_pair(*forms, splits, settings, world=world)  # θa's form, as merge wrote π(θb)
    name = f"seed{seed_a}-seed{seed_b}"
    bar = dict(desc=f"measure {name}", unit="method", disable=not show_progress(), leave=False)
    for method in tqdm(read("permute.methods"), **bar):
        loaded = (load_checkpoint(merged / method / f"{c}.pt") for c in ("permuted_b", "midpoint"))
        tables, summary = measure_method(pair, *loaded)
        if world.is_main:  # one writer
            for table, rows in tables.items():
                write_table(out / method / f"{table}.parquet", pd.DataFrame(rows))
            write_json(out / method / "summary.json", {"seed_a": seed_a, "seed_b": seed_b, "method": method, **summary})
            typer.echo(report_line(method, name, summary, world.size))
    leave_world(world)


def report_line(method: str, name: str, summary: dict, processes: int) -> str:
    """The line printed per method: the test loss barrier at ½ (and Taylor's), the L2 reduction, R_0.3."""
    return (
        f"{method} {name}: test loss barrier ½ {summary['test_loss_barrier_mid']:.4f} "
        f"(Taylor {summary['test_taylor_barrier_mid']:.4f}), L2 -{summary['l2_reduction_pct']:.1f}%, "
        f"R_0.3 {summary.get('R_0.3', float('nan')):.3f}" + (f" ({processes} processes)" if processes > 1 else "")
    )


if __name__ == "__main__":
    run_warm(app)
