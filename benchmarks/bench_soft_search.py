"""Benchmark the permutation searches on trained pairs of a `dvc repro` workspace.

For each pair and method: search time (learning-curve monitoring excluded), L2 before/after,
reduction %, and the midpoint test-loss barrier B_½ (the paper's Tables 1–3); for `ste`, seconds per epoch.
Options come from the params file's ``permute.<method>`` blocks (``--set method.key=value`` to
override, e.g. ``--set wm_sinkhorn.iterations=100`` for the paper's setting). Writes
``benchmarks/scratch/soft_search.json`` and prints a Markdown table.

    python benchmarks/bench_soft_search.py --data-dir data --pairs 0-1,2-3

Timings depend on the machine's load; say whether it was shared when quoting them.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import yaml
from record import SCRATCH, record  # benchmarks/record.py: the one shape of a result

from lmclab.archs.checkpoint import load_checkpoint
from lmclab.core.data import load_split
from lmclab.core.evaluate import evaluate
from lmclab.core.merge import aligned_midpoint
from lmclab.core.metrics import l2_distance, midpoint_barrier, reduction_rate
from lmclab.search import SearchProblem, run_search
from lmclab.search.registered import search_problem

ROOT = Path(__file__).resolve().parent.parent


def run(problem: SearchProblem, method: str, options: dict, seed: int) -> dict:
    start = time.perf_counter()
    result = run_search(method, problem, seed=seed, options=options)
    wall = time.perf_counter() - start
    spec, model = problem.spec, problem.model
    permuted_b, merged = aligned_midpoint(spec, problem.params_a, problem.params_b, result.perm)
    loss_a, loss_b, loss_mid = (evaluate(model, p, problem.test).loss for p in (problem.params_a, permuted_b, merged))
    before = l2_distance(spec, problem.params_a, problem.params_b)
    after = l2_distance(spec, problem.params_a, permuted_b)
    row = {
        "method": method,
        "search_s": result.stats["seconds"],
        "wall_s": wall,
        "l2_before": before,
        "l2_after": after,
        "reduction_pct": reduction_rate(before, after),
        "test_loss_barrier_mid": midpoint_barrier(loss_mid, loss_a, loss_b),
    }
    if "epochs" in result.stats:
        row["s_per_epoch"] = result.stats["seconds"] / result.stats["epochs"]
    return row


def permute_options(params: Path, overrides: list[str]) -> dict:
    """The ``permute`` block of ``params`` with ``method.key=value`` overrides (YAML values)."""
    permute = yaml.safe_load(params.read_text())["permute"]
    for item in overrides:
        key, value = item.split("=", 1)
        method, option = key.split(".", 1)
        permute.setdefault(method, {})[option] = yaml.safe_load(value)
    return permute


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=ROOT / "data")
    parser.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    parser.add_argument("--pairs", default="0-1,2-3")
    parser.add_argument("--methods", default="identity,wm,am,ste,wm_sinkhorn,ste_sinkhorn")
    parser.add_argument("--set", action="append", default=[], help="method.key=value (YAML value)")
    parser.add_argument("--out", type=Path, default=SCRATCH / "soft_search.json")
    args = parser.parse_args()
    permute = permute_options(args.params, args.set)
    train = load_split(args.data_dir / "prepared", "train")
    test = load_split(args.data_dir / "prepared", "test")
    rows = []
    for pair in args.pairs.split(","):
        seed_a, seed_b = pair.split("-")
        a = load_checkpoint(args.data_dir / "models" / f"seed{seed_a}.pt")
        b = load_checkpoint(args.data_dir / "models" / f"seed{seed_b}.pt")
        problem = search_problem(
            a.arch, a.config, a.state_dict, b.state_dict, device=torch.device("cpu"), train=train, test=test
        )
        for method in args.methods.split(","):
            row = {"pair": pair, **run(problem, method, permute.get(method) or {}, permute["seed"])}
            rows.append(row)
            print(json.dumps(row), flush=True)
    record(args.out, rows, options=permute)
    cols = [
        "pair",
        "method",
        "search_s",
        "l2_before",
        "l2_after",
        "reduction_pct",
        "test_loss_barrier_mid",
        "s_per_epoch",
    ]
    print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for r in rows:
        print(
            "| " + " | ".join(f"{r[c]:.4g}" if isinstance(r.get(c), float) else str(r.get(c, "—")) for c in cols) + " |"
        )


if __name__ == "__main__":
    main()
