"""Seconds per epoch of the transformer presets: supervised training of the ``vit`` preset's
ViT and MAE pretraining of the ``mae`` preset's, on the mnist5k digits, measured in one run, alternating
(lone timings drift by half on a shared machine).

    python benchmarks/bench_vit_epoch.py [--repeats 3] [--out benchmarks/results/vit_epoch.json]

Each repeat times one epoch of each objective from the library's ``train`` and ``train_mae`` (the test
evaluation after the epoch included, as in the pipeline) with the preset's batch size and learning rate.
The median of the repeats is reported (the first repeat of a process pays one-time allocations).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from record import record  # benchmarks/record.py: the one shape of a result

from lmclab.archs import mae, make_config
from lmclab.core.data import load_split, prepare
from lmclab.pipeline.stage import parse_yaml
from lmclab.train.mae_training import train_mae
from lmclab.train.training import train

ROOT = Path(__file__).resolve().parent.parent


def preset(name: str) -> dict:
    return parse_yaml((ROOT / "presets" / f"{name}.yaml").read_text())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "vit_epoch.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        meta = prepare("mnist5k", Path(tmp) / "raw", Path(tmp) / "prepared")
        splits = {s: load_split(Path(tmp) / "prepared", s) for s in ("train", "test")}
    sup, pre = preset("vit"), preset("mae")
    config = make_config("vit", input_shape=meta["input_shape"], num_classes=10, **sup["model"]["vit"])
    mae_config = mae.from_vit(config, **pre["train"]["mae"])
    times: dict[str, list[float]] = {"supervised": [], "mae": []}
    for _ in range(args.repeats):
        start = time.perf_counter()
        train(
            "vit",
            config,
            0,
            splits["train"],
            splits["test"],
            epochs=1,
            lr=sup["train"]["lr"],
            batch_size=sup["train"]["batch_size"],
        )
        times["supervised"].append(time.perf_counter() - start)
        start = time.perf_counter()
        train_mae(
            mae_config,
            0,
            splits["train"],
            test=splits["test"],
            epochs=1,
            lr=pre["train"]["lr"],
            batch_size=pre["train"]["batch_size"],
        )
        times["mae"].append(time.perf_counter() - start)
    rows = [{"objective": k, "seconds_per_epoch": sorted(v)[len(v) // 2], "all": v} for k, v in times.items()]
    record(args.out, rows)
    print(json.dumps({r["objective"]: r["seconds_per_epoch"] for r in rows}))


if __name__ == "__main__":
    main()
