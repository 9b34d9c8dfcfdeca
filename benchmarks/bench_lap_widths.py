"""Benchmark: the assignment solvers of ``lap_backend`` (:mod:`lmclab.core.assignment`: scipy and lapx) at the
widths of the usual 1 B–8 B language models' groups — 2,048 (TinyLlama's stream), 5,632 (its MLP), 8,192
(Llama-3 8B's stream… and a 1 B model's MLP), 11,008 (Llama-2 7B's MLP), 14,336 (Llama-3 8B's MLP) — on float32
costs as weight matching builds them (converted to float64 by both solvers), timed alternately in one process.

Two kinds of cost: ``random`` (standard normal entries: no structure, the worst case for an augmenting-path
solver's early rounds) and ``planted`` (a random permutation's entries raised by 3, plus the normal noise: the
cost of a model against a near copy of itself, WM's late sweeps). Each row: the seconds of each solver, the
ratio lapx/scipy, whether both reached the same optimum (relative 1e-9), and the cost's float64 memory. A GPU
solver is measured when a GPU is present and one is installed; without one the rows say so (``gpu``).

    python benchmarks/bench_lap_widths.py [--widths 2048,5632,8192,11008,14336] [--repeats 1]

Writes ``benchmarks/results/lap_widths.json`` (``benchmarks/record.py``).
"""

from __future__ import annotations

import time

import torch
import typer
from record import RESULTS, record, this_run  # benchmarks/record.py: the one shape of a result

from lmclab.core.assignment import BACKENDS, solve_assignment

WIDTHS = (2048, 5632, 8192, 11008, 14336)
OUT = RESULTS / "lap_widths.json"


def cost(kind: str, n: int, seed: int) -> torch.Tensor:
    """A float32 (n, n) cost of ``kind`` (module docstring)."""
    generator = torch.Generator().manual_seed(seed)
    c = torch.randn(n, n, generator=generator)
    if kind == "planted":
        c[torch.arange(n), torch.randperm(n, generator=generator)] += 3.0
    return c


def value(c: torch.Tensor, p: torch.Tensor) -> float:
    return float(c.double()[torch.arange(len(p)), p].sum())


def main(widths: str = ",".join(map(str, WIDTHS)), repeats: int = 1) -> None:
    sizes = [int(w) for w in widths.split(",")]
    rows = []
    for n in sizes:
        for kind in ("random", "planted"):
            c = cost(kind, n, seed=n)
            seconds: dict[str, list[float]] = {b: [] for b in BACKENDS}
            found = {}
            for _ in range(repeats):
                for backend in BACKENDS:  # alternating: a drift of the machine hits both
                    start = time.perf_counter()
                    found[backend] = solve_assignment(c, backend)
                    seconds[backend].append(time.perf_counter() - start)
            best = {b: min(s) for b, s in seconds.items()}
            same = abs(value(c, found["lapx"]) - value(c, found["scipy"])) <= 1e-9 * abs(value(c, found["scipy"]))
            row = {"n": n, "kind": kind, "seconds": best, "ratio_lapx": best["lapx"] / best["scipy"]}
            rows.append(row | {"same_optimum": same, "cost_gb": n * n * 8 / 1e9, "gpu": "none: no GPU"})
            print(rows[-1], flush=True)
    record(OUT, rows, run=this_run(widths=sizes, repeats=repeats))


if __name__ == "__main__":
    typer.run(main)
