"""Stage train (one instance per seed): train one endpoint, write the checkpoint
``{arch, config, seed, state_dict}`` and the per-epoch history (Parquet). Default MLP: ~10 s;
ResNet20 ×1 on the 4,000 mnist5k digits: roughly 10–20 s per epoch on this 2-core CPU.
Reads ``model.arch`` and that architecture's options block ``model.<arch>``."""

from __future__ import annotations

from pathlib import Path

import typer

from common import one_line_errors, run_warm, show_progress, stage_params

app = typer.Typer(add_completion=False)
TRAIN_KEYS = ("epochs", "lr", "batch_size", "optimizer", "momentum", "weight_decay", "schedule",
              "warmup_epochs", "augment")


@app.command()
@one_line_errors
def main(seed: int = typer.Option(...), data: Path = typer.Option(...), out: Path = typer.Option(...),
         history: Path = typer.Option(...), params: Path = Path("params.yaml")) -> None:
    import pandas as pd

    from lmclab.archs import make_config
    from lmclab.atomic import atomic_path
    from lmclab.augment import resolve_augment
    from lmclab.checkpoint import save_checkpoint
    from lmclab.data import load_meta, load_split
    from lmclab.device import resolve_device
    from lmclab.training import train

    read = stage_params("train", params)
    arch = read("model.arch")
    model = read(f"model.{arch}") or {}
    opts = {k: read(f"train.{k}") for k in TRAIN_KEYS}
    device = resolve_device(read("device"))
    meta = load_meta(data)
    opts["augment"] = resolve_augment(opts["augment"], meta["name"])
    config = make_config(arch, input_shape=meta["input_shape"], num_classes=meta["num_classes"], **model)
    ckpt, rows = train(arch, config, seed,
                       load_split(data, "train"), load_split(data, "test"), device=device,
                       progress=show_progress(), **opts)
    save_checkpoint(out, ckpt)
    with atomic_path(history) as tmp:
        pd.DataFrame([{"seed": seed, **r} for r in rows]).to_parquet(tmp, index=False)
    typer.echo(f"seed {seed}: test acc {rows[-1]['test_acc']:.4f}, test loss {rows[-1]['test_loss']:.4f}")


if __name__ == "__main__":
    run_warm(app)
