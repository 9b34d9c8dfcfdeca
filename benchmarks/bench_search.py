"""Benchmark: wall time of one permutation search on a 3 × 512 MLP pair (the paper's MNIST model).

Uses the default pipeline's trained checkpoints (data/models/seed0.pt, seed1.pt) when present,
else two randomly initialised 3 × 512 MLPs. Reports the median of --repeats runs per method, with
the number of WM sweeps. Run: `make bench` or `.venv/bin/python benchmarks/bench_search.py`.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch
import typer
from record import SCRATCH, record  # benchmarks/record.py: the one shape of a result

from lmclab.archs import build_model, make_config
from lmclab.archs.checkpoint import load_checkpoint
from lmclab.core.data import load_split, prepare
from lmclab.search import run_search
from lmclab.search.registered import search_problem

ROOT = Path(__file__).resolve().parent.parent


def _pair() -> tuple[str, object, dict, dict]:
    a, b = ROOT / "data/models/seed0.pt", ROOT / "data/models/seed1.pt"
    if a.is_file() and b.is_file():
        ca, cb = load_checkpoint(a), load_checkpoint(b)
        return "trained (data/models seed0, seed1)", ca.config, ca.state_dict, cb.state_dict
    config = make_config("mlp", input_shape=(1, 28, 28), num_classes=10, hidden=3, width=512)
    return (
        "random init",
        config,
        build_model("mlp", config, seed=0).state_dict(),
        build_model("mlp", config, seed=1).state_dict(),
    )


def main(repeats: int = 5, methods: str = "wm,am", out: Path = SCRATCH / "search.json") -> None:
    source, config, params_a, params_b = _pair()
    prepared = ROOT / "data/prepared"
    if not (prepared / "meta.json").is_file():
        prepared = Path("/tmp/lmclab-bench-prepared")
        prepare("mnist5k", Path("/tmp/lmclab-bench-raw"), prepared)
    problem = search_problem(
        "mlp", config, params_a, params_b, device=torch.device("cpu"), train=load_split(prepared, "train")
    )
    model, rows = f"mlp {config.hidden} x {config.width}, {source}", []
    for method in methods.split(","):
        times, sweeps = [], []
        for _ in range(repeats):
            start = time.perf_counter()
            result = run_search(method, problem, seed=0, options={})
            times.append(time.perf_counter() - start)
            sweeps.append(result.stats.get("sweeps", 0))
        rows.append(
            {
                "method": method,
                "median_s": statistics.median(times),
                "min_s": min(times),
                "sweeps": sweeps[0],
                "repeats": repeats,
            }
        )
        typer.echo(
            f"{method:>4}: median {statistics.median(times):.3f} s, min {min(times):.3f} s "
            f"({sweeps[0]} sweeps) over {repeats} runs"
        )
    record(out, rows, model=model)


if __name__ == "__main__":
    typer.run(main)
