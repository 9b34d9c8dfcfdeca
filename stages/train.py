"""Stage train (one instance per seed): train one endpoint, write the checkpoint
``{arch, config, seed, state_dict}`` and the per-epoch history (Parquet), and log each epoch to the
seed's DVCLive directory as it ends (``lmclab.pipeline.live``; docs/live-training.md). Default MLP: ~10 s;
ResNet20 ×1 on the 4,000 mnist5k digits: roughly 10–20 s per epoch on this 2-core CPU.
Reads ``model.arch`` and that architecture's options block ``model.<arch>``. With
``train.nproc_per_node × train.nnodes > 1`` it relaunches itself under torchrun (data-parallel,
``lmclab.core.distributed``); rank 0 writes the outputs and logs."""

from __future__ import annotations

from pathlib import Path

import typer
from _repo_src import DVC_YAML  # first: this repository's src/ on sys.path

from lmclab.pipeline.live import epoch_logger
from lmclab.pipeline.stage import (
    LazyKeys,
    model_key,
    one_line_errors,
    params_errors,
    run_warm,
    show_progress,
    stage_params,
    under,
)
from lmclab.pipeline.torchrun import join_torchrun, relaunch_under_torchrun

app = typer.Typer(add_completion=False)
LAUNCH_KEYS = ("nproc_per_node", "nnodes", "rdzv_endpoint")


def train_keys() -> tuple[str, ...]:
    """train()'s options, each a key train.<option> (imported when needed: the module loads torch)."""
    from lmclab.train.training import TrainOptions

    return tuple(TrainOptions.model_fields)


# the params.yaml key of each argument the library's errors name (the architecture's: model_key)
KEYS = LazyKeys(lambda: under("train", *train_keys(), *LAUNCH_KEYS))


@app.command()
@one_line_errors
@params_errors(KEYS)  # the library's errors, under their params.yaml keys
def main(
    seed: int = typer.Option(...),
    data: Path = typer.Option(...),
    out: Path = typer.Option(...),
    history: Path = typer.Option(...),
    live: Path = typer.Option(..., help="DVCLive directory of this seed (metrics.json, plots/metrics/)"),
    params: Path = Path("params.yaml"),
) -> None:
    from lmclab.core.device import resolve_device
    from lmclab.core.distributed import leave_world

    read = stage_params("train", params, dvc_yaml=DVC_YAML)
    argv = [f"--{k}={v}" for k, v in dict(seed=seed, data=data, out=out, history=history, live=live).items()]
    launch = {k: read(f"train.{k}") for k in LAUNCH_KEYS}
    relaunch_under_torchrun(__file__, [*argv, f"--params={params}"], run_id=f"lmclab-train-seed{seed}", **launch)
    world = join_torchrun(resolve_device(read("device")))
    arch = read("model.arch")
    config, opts = config_and_options(read, arch, data)
    if read("train.objective") == "mae":
        with epoch_logger(live, main=True) as on_epoch:
            rows = pretrain_mae(config, seed, read("train.mae"), opts, data, out, world.device, on_epoch)
        write_history(history, seed, rows)
        typer.echo(f"seed {seed}: MAE test reconstruction loss {rows[-1]['test_loss']:.4f}")
        return
    with params_errors(KEYS, model_key(arch)), epoch_logger(live, main=world.is_main) as on_epoch:
        ckpt, rows = train_supervised(arch, config, seed, data, opts, world, on_epoch)
    if world.is_main:  # one writer
        from lmclab.archs.checkpoint import save_checkpoint

        save_checkpoint(out, ckpt)
        write_history(history, seed, rows)
        processes = f" ({world.size} processes)" if world.size > 1 else ""
        typer.echo(
            f"seed {seed}: test acc {rows[-1]['test_acc']:.4f}, test loss {rows[-1]['test_loss']:.4f}{processes}"
        )
    leave_world(world)


def config_and_options(read, arch: str, data: Path) -> tuple:
    """The architecture's config for the prepared data's shape and classes (errors under ``model.<arch>``)
    and train()'s options, ``augment: auto`` resolved for the data set."""
    from lmclab.archs import make_config
    from lmclab.core.data import load_meta
    from lmclab.train.augment import resolve_augment

    meta = load_meta(data)
    opts = {k: read(f"train.{k}") for k in train_keys()}
    opts["augment"] = resolve_augment(opts["augment"], meta["name"])
    with params_errors(KEYS, model_key(arch)):  # and the model's, under model.arch and model.<arch>
        model = read(f"model.{arch}") or {}
        config = make_config(arch, input_shape=meta["input_shape"], num_classes=meta["num_classes"], **model)
    return config, opts


def train_supervised(arch: str, config, seed: int, data: Path, opts: dict, world, on_epoch) -> tuple:
    from lmclab.core.data import load_split
    from lmclab.train.training import train

    splits = load_split(data, "train"), load_split(data, "test")
    kwargs = dict(device=world.device, world=world, progress=show_progress(), on_epoch=on_epoch)
    return train(arch, config, seed, *splits, **kwargs, **opts)


def mae_keys() -> dict[str, str]:
    """The params.yaml key of each argument MAE pretraining's errors name."""
    from lmclab.archs.mae import PRETRAINING_KEYS

    return {**KEYS, **{k: f"train.mae.{k}" for k in ("pretraining", *PRETRAINING_KEYS)}, "pool": "model.vit.pool"}


MAE_KEYS = LazyKeys(mae_keys)


def pretrain_mae(vit_config, seed: int, pretraining: dict, opts: dict, data: Path, out: Path, device, on_epoch):
    """``train.objective: mae``: pretrain the MAE whose encoder is ``model.vit`` (lmclab.train.mae_training)
    and save it as an ``mae`` checkpoint; the history rows carry NaN accuracies (there are no predictions)."""
    from lmclab.archs.checkpoint import Checkpoint, save_checkpoint
    from lmclab.archs.mae import from_vit
    from lmclab.core.data import load_split
    from lmclab.train.mae_training import train_mae

    keys = ("epochs", "lr", "batch_size", "weight_decay", "schedule", "warmup_epochs")
    with params_errors(MAE_KEYS):
        config = from_vit(vit_config, **pretraining)
        state, rows = train_mae(
            config,
            seed,
            load_split(data, "train"),
            **{k: opts[k] for k in keys},
            test=load_split(data, "test"),
            device=device,
            progress=show_progress(),
            on_epoch=on_epoch,
        )
    save_checkpoint(out, Checkpoint("mae", config, seed, state))
    nan = float("nan")
    return [{"train_acc": nan, "test_acc": nan, **r} for r in rows]


def write_history(path: Path, seed: int, rows: list[dict]) -> None:
    """One row per epoch, tagged with ``seed`` (Parquet, written atomically)."""
    import pandas as pd

    from lmclab.core.atomic import write_table

    write_table(path, pd.DataFrame([{"seed": seed, **r} for r in rows]))


if __name__ == "__main__":
    run_warm(app)
