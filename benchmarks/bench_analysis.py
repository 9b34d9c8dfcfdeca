"""Time the paper's analyses on one pair of trained models from a finished `dvc repro`
(default: 3 × 512 MLPs, pair seed0-seed1 aligned by WM). Prints seconds per piece.

    python benchmarks/bench_analysis.py [--pair seed0-seed1] [--method wm] [--threads N] [--repeat 2]

Timings depend on load: on a shared 2-core machine, multi-threaded LAPACK/BLAS can be many
times slower than one thread, so the script reports the torch thread count it used.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from lmclab.analysis.alignment import layer_names
from lmclab.analysis.compose import Analysis, Endpoints, alignment_summary, analyze_model, analyze_pair
from lmclab.analysis.energy import theorem42
from lmclab.analysis.taylor import taylor_terms
from lmclab.archs import build_model, get_arch
from lmclab.archs.checkpoint import load_checkpoint
from lmclab.core.data import load_split
from lmclab.core.metrics import lambda_grid

ROOT = Path(__file__).resolve().parent.parent


def timed(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pair", default="seed0-seed1")
    parser.add_argument("--method", default="wm")
    parser.add_argument("--data", type=Path, default=ROOT / "data")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    seed_a, seed_b = args.pair.split("-")
    a, b = (load_checkpoint(args.data / "models" / f"{s}.pt") for s in (seed_a, seed_b))
    merged = args.data / "merged" / args.pair / args.method
    pb, mid = (load_checkpoint(merged / f"{n}.pt").state_dict for n in ("permuted_b", "midpoint"))
    spec, model = get_arch(a.arch).permutation_spec(a.config), build_model(a.arch, a.config)
    splits = {s: load_split(args.data / "prepared", s) for s in ("train", "test")}
    pa, shape = a.state_dict, a.config.input_shape
    print(
        f"{a.arch} {a.config}, {args.pair} {args.method}, train {len(splits['train'])} / test "
        f"{len(splits['test'])} images, torch threads {torch.get_num_threads()}, best of {args.repeat}"
    )
    pieces = {
        "taylor train (grad + HVP at θa and π(θb))": lambda: taylor_terms(model, pa, pb, splits["train"]),
        "taylor test": lambda: taylor_terms(model, pa, pb, splits["test"]),
        "R_γ (4 models' SVDs, γ = 0, 0.3)": lambda: alignment_summary(
            spec, model, pa, b.state_dict, pb, mid, [0, 0.3], input_shape=shape
        ),
        "theorem 4.2 (test)": lambda: theorem42(model, pa, pb, splits["test"], layer_names(spec, pa)),
        "full analyze_pair (stage analyze)": lambda: analyze_pair(
            Endpoints(spec, model, pa, b.state_dict, splits),
            pb,
            mid,
            Analysis(lams=lambda_grid(25), gammas=[0, 0.3], input_shape=shape),
        ),
        "analyze_model, one seed (stage spectra)": lambda: analyze_model(
            spec, model, pa, splits["test"], input_shape=shape
        ),
    }
    for name, fn in pieces.items():
        print(f"{timed(fn, args.repeat):8.2f} s  {name}")


if __name__ == "__main__":
    main()
