"""Time one weight-matching search on random weights of the paper's conv nets.

    python benchmarks/bench_conv_search.py [--threads 1] [--only resnet20|vgg]

Two independently initialised models (seeds 0 and 1, CIFAR input 3×32×32) with randomised BN
statistics; prints sweeps and seconds of WM (coordinate descent, LAP per group). Target: ResNet20 ×16
under 30 s on the 2-core CPU. ``cpu_seconds`` (process CPU time) is what the search costs without other load on
the machine (with one thread: roughly its wall time when idle).
"""

from __future__ import annotations

import argparse
import time

import torch

from lmclab.archs import build_model, get_arch, make_config
from lmclab.search.weight_matching import weight_matching


def bench(arch: str, width: float, threads: int) -> dict:
    torch.set_num_threads(threads)
    config = make_config(arch, input_shape=(3, 32, 32), num_classes=10, width_multiplier=width)
    spec = get_arch(arch).permutation_spec(config)
    params_a = build_model(arch, config, seed=0).state_dict()
    params_b = build_model(arch, config, seed=1).state_dict()
    n_params = sum(v.numel() for k, v in params_a.items() if k not in spec.stats)
    start, cpu_start = time.perf_counter(), time.process_time()
    result = weight_matching(
        spec, params_a, params_b, max_iter=100, tol=1e-7, generator=torch.Generator().manual_seed(0)
    )
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    objective = result.stats.get("objective", [])
    return {
        "arch": arch,
        "width": width,
        "params": n_params,
        "groups": len(spec.groups),
        "max_group": max(spec.group_sizes(params_a).values()),
        "sweeps": result.stats.get("sweeps"),
        "seconds": round(seconds, 2),
        "cpu_seconds": round(cpu_seconds, 2),
        "threads": threads,
        "objective_first_last": [round(objective[0], 1), round(objective[-1], 1)] if objective else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", choices=["resnet20", "vgg"], default=None)
    args = parser.parse_args()
    for arch, width in (("resnet20", 16), ("vgg", 4)):
        if args.only in (None, arch):
            print(bench(arch, width, args.threads), flush=True)


if __name__ == "__main__":
    main()
