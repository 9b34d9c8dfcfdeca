"""The train stage in one process and in two gloo processes under torchrun, on the same global batch.

    python benchmarks/bench_ddp.py [--arch mlp] [--epochs 5] [--repeats 1]

Runs ``stages/train.py`` on the workspace's ``data/prepared`` (run ``dvc repro download`` first) with
params.yaml plus ``train.epochs``, alternating 1 and 2 processes; prints each wall time (the stage's
whole process, torchrun start-up included) and the largest |Δθ| between the two checkpoints. On a
2-core CPU two processes share the cores one process already uses (torchrun sets one thread each),
so expect no speed-up here: the point is the equality; the speed-up is for one process per GPU.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

from lmclab.archs.checkpoint import load_checkpoint

ROOT = Path(__file__).resolve().parent.parent


def run(tmp: Path, tree: dict, nproc: int) -> tuple[float, dict]:
    tree["train"]["nproc_per_node"] = nproc
    params = tmp / f"params{nproc}.yaml"
    params.write_text(yaml.safe_dump(tree))
    out = tmp / f"model{nproc}.pt"
    start = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "stages/train.py",
            "--seed",
            "0",
            "--data",
            "data/prepared",
            "--out",
            str(out),
            "--history",
            str(tmp / f"history{nproc}.parquet"),
            "--live",
            str(tmp / f"live{nproc}"),
            "--params",
            str(params),
        ],
        cwd=ROOT,
        env={**os.environ, "LMCLAB_WARM": "0"},
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - start, load_checkpoint(out).state_dict


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="mlp")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    tree = yaml.safe_load((ROOT / "params.yaml").read_text())
    tree["model"]["arch"], tree["train"]["epochs"], tree["device"] = args.arch, args.epochs, "cpu"
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):
            (t1, one), (t2, two) = run(Path(tmp), tree, 1), run(Path(tmp), tree, 2)
            diff = max(float((one[k].double() - two[k].double()).abs().max()) for k in one)
            scale = max(float(v.abs().max()) for v in one.values() if v.is_floating_point())
            print(
                f"{args.arch}, {args.epochs} epochs, batch {tree['train']['batch_size']}: 1 process {t1:.1f} s, "
                f"2 processes {t2:.1f} s (ratio {t2 / t1:.2f}); max |Δθ| {diff:.2e} (max |θ| {scale:.2f})"
            )


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
