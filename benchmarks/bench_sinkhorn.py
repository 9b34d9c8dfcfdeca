"""lmclab's side of the Sinkhorn benchmark against the authors' reference (README "Sinkhorn methods").

The benchmark pair: two 784-512-512-512-10 MLPs (seeds 0 and 1) trained 30 epochs with Adam 1e-3
at batch 512 on the prepared split of a `dvc repro` workspace (mnist5k by default; cached in
``--cache``). On it, with the reference's settings:

- ``wm_sinkhorn`` (DistL2Loss): Adam lr 1, τ 1, 20 Sinkhorn iterations, the paper's 1,000 steps
  checked every 10 (100 epochs × 10 iterations) — its time to reach a target objective is read
  off the curve, whose rows carry the elapsed seconds;
- ``ste_sinkhorn`` (MidLoss): AdamW lr 0.1, weight decay 0.01, batch 512, 5 epochs, last batch kept;
- ``ste`` (STE v2 of git-re-basin): SGD lr 0.01, momentum 0.9, batch 512, 250 epochs, the best
  minibatch's permutation, no held-out data.

Each permutation is scored by the same code: ⟨θa, π(θb)⟩, L2 reduction %, test B½. Also the FLOP
floor of one ``wm_sinkhorn`` and one ``ste_sinkhorn`` step (their matrix products, at this machine's
measured float32 and bfloat16 GEMM rates).

    python benchmarks/bench_sinkhorn.py --data-dir data --repeats 3 [--methods wm_sinkhorn,ste_sinkhorn,ste]

Writes ``benchmarks/scratch/sinkhorn.json``. The reference's side is run outside the project with
the same functions (the README gives the command); its code never enters lmclab.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from record import SCRATCH, record  # benchmarks/record.py: the one shape of a result

from lmclab.archs import get_arch
from lmclab.archs.checkpoint import atomic_save
from lmclab.core.data import load_meta, load_split
from lmclab.core.evaluate import evaluate
from lmclab.core.merge import aligned_midpoint
from lmclab.core.metrics import l2_distance, midpoint_barrier, reduction_rate
from lmclab.core.spec import PermutationSpec, apply_permutation
from lmclab.search.ste import ste
from lmclab.search.ste_sinkhorn import ste_sinkhorn
from lmclab.search.weight_matching import matching_objective
from lmclab.search.wm_sinkhorn import wm_sinkhorn
from lmclab.train.training import train

ROOT = Path(__file__).resolve().parent.parent

SETTINGS = {  # the reference's settings (README "Sinkhorn methods")
    "wm_sinkhorn": {"lr": 1.0, "epochs": 100, "iterations": 10, "tau": 1.0, "sinkhorn_iters": 20},
    "ste_sinkhorn": {
        "optimizer": "adamw",
        "lr": 0.1,
        "weight_decay": 0.01,
        "epochs": 5,
        "batch_size": 512,
        "drop_last": False,
    },
    "ste": {
        "optimizer": "sgd",
        "lr": 0.01,
        "momentum": 0.9,
        "epochs": 250,
        "batch_size": 512,
        "select": "best_batch",
        "holdout": 0.0,
    },
}


class Pair:
    """The trained pair with its data, spec and an evaluation skeleton."""

    def __init__(self, data_dir: Path, cache: Path, epochs: int = 30) -> None:
        prepared = data_dir / "prepared"
        meta = load_meta(prepared)
        self.arch = get_arch("mlp")
        self.config = self.arch.Config(input_shape=tuple(meta["input_shape"]), num_classes=meta["num_classes"])
        self.train, self.test = load_split(prepared, "train"), load_split(prepared, "test")
        if not cache.exists():
            states = [
                train("mlp", self.config, seed, self.train, self.test, epochs=epochs)[0].state_dict for seed in (0, 1)
            ]
            atomic_save({"a": states[0], "b": states[1]}, cache)
        states = torch.load(cache, weights_only=True)
        self.params_a, self.params_b = states["a"], states["b"]
        self.spec: PermutationSpec = self.arch.permutation_spec(self.config)

    def model(self) -> torch.nn.Module:
        return self.arch.Model(self.config)

    def score(self, perm: dict) -> dict:
        """⟨θa, π(θb)⟩, L2 reduction % and test B½ of ``perm`` (θb aligned to θa)."""
        spec, a, b = self.spec, self.params_a, self.params_b
        permuted_b, merged = aligned_midpoint(spec, a, b, perm)
        losses = [evaluate(self.model(), p, self.test).loss for p in (a, permuted_b, merged)]
        return {
            "objective": matching_objective(spec, perm, a, b),
            "L2_red": reduction_rate(l2_distance(spec, a, b), l2_distance(spec, a, apply_permutation(spec, perm, b))),
            "B_half": midpoint_barrier(losses[2], losses[0], losses[1]),
        }


def run(pair: Pair, method: str, seed: int, **overrides: object) -> dict:
    """One search with the reference's settings (``overrides`` on top); time excludes scoring."""
    options = {**SETTINGS[method], **overrides}
    generator = torch.Generator().manual_seed(seed)
    a, b = pair.params_a, pair.params_b
    if method == "wm_sinkhorn":
        result = wm_sinkhorn(pair.spec, a, b, generator=generator, **options)
    else:
        search = ste_sinkhorn if method == "ste_sinkhorn" else ste
        result = search(pair.spec, a, b, model=pair.model(), data=pair.train, generator=generator, **options)
    row = {"method": method, "seed": seed, "seconds": result.stats["seconds"], **pair.score(result.perm)}
    if method == "wm_sinkhorn":
        row["curve"] = [{k: r[k] for k in ("epoch", "objective", "seconds")} for r in result.stats["curve"]]
    if method == "ste_sinkhorn":
        row["steps"] = result.stats["curve"][-1]["steps"]
    return row


def time_to(curve: list[dict], objective: float) -> float | None:
    """Seconds until the curve's objective first reaches ``objective`` (None: never)."""
    return next((r["seconds"] for r in curve if r["objective"] >= objective), None)


def step_flops(pair: Pair) -> float:
    """Matrix-product FLOPs of one ``wm_sinkhorn`` step: per parameter, one product per permuted
    axis (2·n·numel); backward, one product for the scores of each axis and one more for the
    input of every product after the first (θb itself needs no gradient)."""
    total = 0.0
    for name, value in pair.spec.matched(pair.params_b).items():
        permuted = [axis for axis, g in enumerate(pair.spec.axes[name]) if g is not None]
        for i, axis in enumerate(permuted):
            total += 2.0 * value.shape[axis] * value.numel() * (2 if i == 0 else 3)
    return total


def model_flops(pair: Pair, batch: int = 512) -> float:
    """Matrix-product FLOPs of the midpoint MLP's forward and backward on ``batch`` images (the rest of
    a ``ste_sinkhorn`` step, whose π_soft(θb) costs :func:`step_flops`): per layer 2·batch·in·out forward,
    as much for the weight gradient, and as much for the input gradient of every layer but the first."""
    layers = [v.shape for k, v in pair.params_a.items() if k.endswith("weight")]
    return sum(2.0 * batch * out * inp * (2 if i == 0 else 3) for i, (out, inp) in enumerate(layers))


def gemm_rate(n: int = 512, m: int = 784, repeats: int = 50, dtype: torch.dtype = torch.float32) -> float:
    """FLOP/s of an (n × n) @ (n × m) product in ``dtype`` on this machine (median of ``repeats``)."""
    x, y = torch.randn(n, n).to(dtype), torch.randn(n, m).to(dtype)
    x @ y  # the first product of a dtype may compile its kernel
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        x @ y
        times.append(time.perf_counter() - start)
    return 2.0 * n * n * m / statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=ROOT / "data")
    parser.add_argument("--cache", type=Path, default=ROOT / "data" / "bench_pair_mlp_30ep.pt")
    parser.add_argument("--methods", default="wm_sinkhorn,ste_sinkhorn,ste")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=SCRATCH / "sinkhorn.json")
    args = parser.parse_args()
    pair = Pair(args.data_dir, args.cache)
    rows = [run(pair, method, seed) for seed in range(args.repeats) for method in args.methods.split(",")]
    floor = {
        "step_gflop": step_flops(pair) / 1e9,
        "ste_step_gflop": (step_flops(pair) + model_flops(pair)) / 1e9,
        "gemm_gflops": gemm_rate() / 1e9,
        "gemm_gflops_bf16": gemm_rate(dtype=torch.bfloat16) / 1e9,
    }
    record(args.out, rows, settings=SETTINGS, floor=floor)
    for r in rows:
        print(json.dumps({k: v for k, v in r.items() if k != "curve"}))
    print(json.dumps(floor))


if __name__ == "__main__":
    main()
