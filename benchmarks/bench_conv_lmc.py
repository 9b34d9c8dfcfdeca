"""LMC of ResNet20 on the offline mnist5k digits, with and without BatchNorm repair.

    python benchmarks/bench_conv_lmc.py [--width 0.5] [--epochs 4] [--threads 1]

Trains two endpoints (seeds 0 and 1; Adam, linear decay to 0, batch 128, no augmentation) on the
4,000 training digits, aligns θb to θa with identity (naive), WM and AM, and reports the test
accuracy of the endpoints and of the midpoint (θa + π(θb))/2 with stale BN statistics and with
statistics repaired on ``--repair-samples`` training images. Writes benchmarks/scratch/conv_lmc.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from record import SCRATCH, record  # benchmarks/record.py: the one shape of a result

from lmclab.archs import build_model, get_arch, make_config
from lmclab.core.bn_repair import bn_repair_hook
from lmclab.core.data import load_split, prepare
from lmclab.core.evaluate import evaluate
from lmclab.core.interpolation import measure_pair_with_repair
from lmclab.core.spec import apply_permutation
from lmclab.search import run_search
from lmclab.search.registered import search_problem
from lmclab.train.training import train


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--width", type=float, default=0.5)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--repair-samples", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        prepare("mnist5k", Path(tmp) / "raw", Path(tmp) / "prepared")
        splits = {s: load_split(Path(tmp) / "prepared", s) for s in ("train", "test")}
    config = make_config("resnet20", input_shape=(1, 28, 28), num_classes=10, width_multiplier=args.width)
    start = time.perf_counter()
    endpoints = [
        train(
            "resnet20",
            config,
            seed,
            splits["train"],
            splits["test"],
            epochs=args.epochs,
            lr=args.lr,
            batch_size=128,
            schedule="linear",
            progress=False,
        )[0].state_dict
        for seed in (0, 1)
    ]
    train_seconds = time.perf_counter() - start
    model, spec = build_model("resnet20", config), get_arch("resnet20").permutation_spec(config)
    repair = bn_repair_hook(model, splits["train"], repair_samples=args.repair_samples)
    out = {
        "config": vars(args),
        "train_seconds_two_models": round(train_seconds, 1),
        "endpoint_test_acc_a_b": [round(100 * evaluate(model, p, splits["test"]).acc, 2) for p in endpoints],
    }
    for method in ("identity", "wm", "am"):
        problem = search_problem(
            "resnet20", config, endpoints[0], endpoints[1], device=torch.device("cpu"), train=splits["train"]
        )
        result = run_search(method, problem, seed=0, options={})
        permuted_b = apply_permutation(spec, result.perm, endpoints[1])
        rows, summary = measure_pair_with_repair(
            spec,
            model,
            endpoints[0],
            endpoints[1],
            permuted_b,
            [0.0, 0.5, 1.0],
            {"test": splits["test"]},
            repair=repair,
        )
        mid = {r["repair"]: round(100 * r["acc"], 2) for r in rows if r["lam"] == 0.5}
        out[method] = {
            "method": method,
            "midpoint_acc_stale_bn": mid[False],
            "midpoint_acc_repaired": mid[True],
            "endpoint_acc_repaired_a_b": [
                round(100 * r["acc"], 2) for lam in (1.0, 0.0) for r in rows if r["repair"] and r["lam"] == lam
            ],
            "l2_reduction_pct": round(summary["l2_reduction_pct"], 2),
            "search_seconds": round(result.stats["seconds"], 2),
            "sweeps": result.stats.get("sweeps"),
        }
        print(method, out[method], flush=True)
    print(json.dumps(out, indent=2))
    record(SCRATCH / "conv_lmc.json", list(out.values()))


if __name__ == "__main__":
    main()
