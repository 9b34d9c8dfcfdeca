"""What the default run needs to show the paper's MNIST-MLP findings, measured.

Trains ``--seeds`` MLPs (3 × 512, Adam 1e-3, batch 512: the paper's recipe) on the prepared split of
a `dvc repro` workspace for each of ``--epochs``, then runs the searches of ``--methods`` on the pairs
(0, 1), (2, 3), … with the options of ``--params`` (``--set method.key=value`` overrides) and
prints per training length and method: mean ± sample std over pairs of the test B½ and the L2
reduction %, and the seconds of training and search. The choice of ``train.epochs`` and of the
Sinkhorn settings in ``params.yaml`` comes from its output (README "Default run").

    python benchmarks/bench_default_choice.py --data-dir data --epochs 10,20,40 --seeds 6

Writes ``benchmarks/scratch/default_choice.json``. Timings depend on the machine's load.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from record import SCRATCH, record  # benchmarks/record.py: the one shape of a result

from lmclab.archs import get_arch
from lmclab.core.data import load_split
from lmclab.search.registered import search_problem
from lmclab.train.training import train

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_soft_search import permute_options, run  # noqa: E402  (found through the sys.path entry above)


def mean_std(values: list[float]) -> str:
    return f"{statistics.mean(values):.4f} ± {statistics.stdev(values) if len(values) > 1 else 0.0:.4f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=ROOT / "data")
    parser.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    parser.add_argument("--epochs", default="10,20,40")
    parser.add_argument("--seeds", type=int, default=6)
    parser.add_argument("--methods", default="identity,wm,am,wm_sinkhorn,ste_sinkhorn")
    parser.add_argument("--set", action="append", default=[], help="method.key=value (YAML value)")
    parser.add_argument("--out", type=Path, default=SCRATCH / "default_choice.json")
    args = parser.parse_args()
    permute = permute_options(args.params, args.set)
    train_split = load_split(args.data_dir / "prepared", "train")
    test_split = load_split(args.data_dir / "prepared", "test")
    config = get_arch("mlp").Config(input_shape=tuple(train_split.x.shape[1:]), num_classes=10)
    rows = []
    for epochs in (int(e) for e in args.epochs.split(",")):
        start = time.perf_counter()
        models = [train("mlp", config, seed, train_split, test_split, epochs=epochs)[0] for seed in range(args.seeds)]
        train_s = (time.perf_counter() - start) / args.seeds
        for a, b in zip(models[0::2], models[1::2], strict=False):  # an odd last seed stays unpaired
            problem = search_problem(
                "mlp",
                config,
                a.state_dict,
                b.state_dict,
                device=torch.device("cpu"),
                train=train_split,
                test=test_split,
            )
            for method in args.methods.split(","):
                row = {
                    "epochs": epochs,
                    "train_s_per_seed": train_s,
                    "pair": f"{a.seed}-{b.seed}",
                    **run(problem, method, permute.get(method) or {}, permute["seed"]),
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
    record(args.out, rows, options=permute)
    print("| epochs | train s/seed | method | test B½ | L2 reduction % | search s |\n|---|---|---|---|---|---|")
    for epochs in dict.fromkeys(r["epochs"] for r in rows):
        for method in args.methods.split(","):
            sel = [r for r in rows if r["epochs"] == epochs and r["method"] == method]
            print(
                f"| {epochs} | {sel[0]['train_s_per_seed']:.1f} | {method} | "
                f"{mean_std([r['test_loss_barrier_mid'] for r in sel])} | "
                f"{mean_std([r['reduction_pct'] for r in sel])} | "
                f"{statistics.mean(r['search_s'] for r in sel):.2f} |"
            )


if __name__ == "__main__":
    main()
