"""Stage measure (one instance per pair, every method of ``permute.methods``): everything measured
on θa and each π(θb). Loss/accuracy along θ(λ) on train and test (BatchNorm nets: with stale and
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
# the params.yaml key of each argument the library's errors name
KEYS = under("measure", "num_lambdas", mode="conv_spectrum", num_samples="bn_repair_samples", gamma="gammas")
REPAIR_KEYS = under("measure", num_samples="repair_samples")


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

    from lmclab.analysis.alignment import check_mode
    from lmclab.analysis.compose import endpoint_factors, measure_and_analyze
    from lmclab.analysis.mae_pair import mae_pair
    from lmclab.archs import build_model, get_arch
    from lmclab.archs.checkpoint import load_checkpoint
    from lmclab.core.atomic import write_json, write_table
    from lmclab.core.bn_repair import bn_repair_hook, has_batchnorm, repair_subset
    from lmclab.core.data import load_split
    from lmclab.core.device import resolve_device
    from lmclab.core.distributed import leave_world
    from lmclab.core.metrics import lambda_grid
    from lmclab.core.objective import is_reconstruction
    from lmclab.core.repair import RepairAt

    read = stage_params("measure", params, dvc_yaml=DVC_YAML)
    opts = read("measure")
    named = dict(
        seed_a=seed_a, seed_b=seed_b, model_a=model_a, model_b=model_b, merged=merged, data=data, out=out, params=params
    )
    args = [f"--{k.replace('_', '-')}={v}" for k, v in named.items()]
    relaunch_under_torchrun(
        __file__, args, run_id=f"lmclab-measure-{seed_a}-{seed_b}", nproc_per_node=opts["nproc_per_node"]
    )
    lams, mode = lambda_grid(opts["num_lambdas"]), opts["conv_spectrum"]
    check_mode(mode)
    world = join_torchrun(resolve_device(read("device")))
    device = world.device
    a, b = load_checkpoint(model_a), load_checkpoint(model_b)
    on = lambda sd: {k: v.to(device) for k, v in sd.items()}  # noqa: E731
    model = build_model(a.arch, a.config).to(device)
    splits = {"train": load_split(data, "train"), "test": load_split(data, "test")}
    repair = (
        bn_repair_hook(model, splits["train"], num_samples=opts["bn_repair_samples"], world=world)
        if opts["bn_repair"] and has_batchnorm(model)
        else None
    )
    repair_at = None
    if opts["repair"] and not has_batchnorm(model):  # REPAIR of LayerNorm and norm-free nets (lmclab.core.repair)
        with params_errors(REPAIR_KEYS):
            repair_at = RepairAt(model, repair_subset(splits["train"], opts["repair_samples"]))
    spec, params_a, params_b = get_arch(a.arch).permutation_spec(a.config), on(a.state_dict), on(b.state_dict)
    factors_a, factors_b = (
        endpoint_factors(spec, model, p, mode=mode, input_shape=a.config.input_shape) for p in (params_a, params_b)
    )  # shared by every method
    from tqdm import tqdm

    for method in tqdm(
        read("permute.methods"),
        desc=f"measure seed{seed_a}-seed{seed_b}",
        unit="method",
        disable=not show_progress(),
        leave=False,
    ):
        permuted_b = load_checkpoint(merged / method / "permuted_b.pt")
        midpoint = load_checkpoint(merged / method / "midpoint.pt")
        curve, summary, taylor, bounds, cka = measure_and_analyze(
            spec,
            model,
            params_a,
            params_b,
            on(permuted_b.state_dict),
            on(midpoint.state_dict),
            splits,
            lams=lams,
            gammas=[float(g) for g in opts["gammas"]],
            mode=mode,
            input_shape=a.config.input_shape,
            taylor_splits=opts["taylor_splits"],
            repair=repair,
            repair_at=repair_at,
            factors_a=factors_a,
            factors_b=factors_b,
            world=world,
        )
        tables = {"curve": curve, "taylor": taylor, "theorem42": bounds, "cka": cka}
        if is_reconstruction(model):  # MAE endpoints: the encoder as a representation, patch errors, blocks
            tables["mae"], tables["residual"], extra = mae_pair(
                model, params_a, on(permuted_b.state_dict), splits["train"].to(device), splits["test"].to(device), lams
            )
            summary |= extra
        if not world.is_main:  # one writer
            continue
        for name, rows in tables.items():
            write_table(out / method / f"{name}.parquet", pd.DataFrame(rows))
        record = {"seed_a": seed_a, "seed_b": seed_b, "method": method, **summary}
        write_json(out / method / "summary.json", record)
        typer.echo(
            f"{method} seed{seed_a}-seed{seed_b}: test loss barrier ½ {summary['test_loss_barrier_mid']:.4f} "
            f"(Taylor {summary['test_taylor_barrier_mid']:.4f}), L2 -{summary['l2_reduction_pct']:.1f}%, "
            f"R_0.3 {summary.get('R_0.3', float('nan')):.3f}" + (f" ({world.size} processes)" if world.size > 1 else "")
        )
    leave_world(world)


if __name__ == "__main__":
    run_warm(app)
