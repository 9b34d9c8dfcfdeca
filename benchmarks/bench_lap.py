"""Benchmark: the two assignment solvers of ``lap_backend`` (lmclab.core.assignment), scipy and lapx,
timed in one process, alternating, medians of ``--repeats``.

1. Single assignments at 512², 1024², 2048² (float64, maximised) on
   ``random`` (standard normal), ``ties`` (integers in {0, 1, 2}: many optima), ``planted`` (a
   permutation plus 0.3 × noise) and ``wm`` — a real weight-matching cost: the middle group's cost of
   two MLPs of that width at the identity (WM's first solve). The pair comes from ``--models`` (folders
   with seed0.pt and seed1.pt, e.g. the default run's ``data/models``), else two random-initialised
   3-layer MLPs (the row says which). Also ``lap.lapjvs`` for comparison (not used by lmclab). Each row:
   median seconds, the ratio lapx/scipy and whether lapx's optimum equals scipy's (to 1e-12 relative).
2. Weight matching (library defaults) on every pair of ``--wm-models`` with each backend: median seconds,
   of which in the assignments (WM's other work, its cost matrices, grows like n³ too), assignments
   solved, the final ⟨θa, π(θb)⟩ of both and whether both found the same permutation.

3. With ``--rebasin DIR``: git-re-basin's own ``weight_matching`` (github.com/samuela/git-re-basin,
   JAX with scipy's solver) on the same pairs, alternating with lmclab's, its permutation scored by the
   same ⟨θa, π(θb)⟩. DIR holds its ``src/weight_matching.py`` and a ``utils.py`` with its one-line
   ``rngmix`` (its own utils.py imports flax, which WM does not need); jax must be importable (e.g.
   ``pip install --target /tmp/jax-site jax jaxlib`` and ``--site /tmp/jax-site``). Nothing of it enters
   lmclab.

    python benchmarks/bench_lap.py --models data/models --models <a 3 × 2048 run's data/models> --repeats 3 \
        --threads 1,2 [--rebasin /tmp/git-re-basin --site /tmp/jax-site]

``--threads``: torch's intra-op threads during WM, one count after another (JAX keeps its own pool, one
thread when ``--threads 1``). On a machine whose cores other jobs also use, two threads can be many
times slower than one (OpenMP threads waiting for each other), which is why the JSON also records the
load average.

Writes ``benchmarks/results/lap.json`` (``benchmarks/record.py``: the command, commit, date and machine; a
row per assignment and per WM pair, ``table`` naming which).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import typer
from record import record, this_run  # benchmarks/record.py: the one shape of a result

from lmclab.archs import build_model, get_arch, make_config
from lmclab.archs.checkpoint import load_checkpoint
from lmclab.core.assignment import BACKENDS, solve_assignment
from lmclab.core.spec import identity_permutation
from lmclab.search import weight_matching as wm_module
from lmclab.search.weight_matching import constant_terms, group_cost, matching_objective, weight_matching

ROOT = Path(__file__).resolve().parent.parent
SIZES = (512, 1024, 2048)


def _pairs(models: list[Path]) -> dict[int, tuple[str, object, dict, dict]]:
    """Width -> (source, config, θa, θb) of each folder's seed0.pt and seed1.pt."""
    pairs = {}
    for folder in models:
        a, b = load_checkpoint(folder / "seed0.pt"), load_checkpoint(folder / "seed1.pt")
        if a.arch == "mlp":
            pairs[a.config.width] = (f"trained ({folder}: seed0, seed1)", a.config, a.state_dict, b.state_dict)
    return pairs


def _random_pair(width: int) -> tuple[str, object, dict, dict]:
    config = make_config("mlp", input_shape=(1, 28, 28), num_classes=10, hidden=3, width=width)
    params = [build_model("mlp", config, seed=s).state_dict() for s in (0, 1)]
    return "random init (seeds 0, 1)", config, *params


def _wm_cost(pair: tuple[str, object, dict, dict]) -> torch.Tensor:
    _, config, params_a, params_b = pair
    spec = get_arch("mlp").permutation_spec(config)
    perm = identity_permutation(spec.group_sizes(params_a))
    return group_cost(spec, "P_1", perm, params_a, params_b, constant_terms(spec, params_a, params_b)).double()


def _matrix(kind: str, n: int, rng: np.random.Generator, pairs: dict) -> tuple[np.ndarray, str]:
    if kind == "random":
        return rng.standard_normal((n, n)), ""
    if kind == "ties":
        return rng.integers(0, 3, (n, n)).astype(np.float64), ""
    if kind == "planted":
        cost = 0.3 * rng.standard_normal((n, n))
        cost[np.arange(n), rng.permutation(n)] += 1.0
        return cost, ""
    pair = pairs.get(n) or _random_pair(n)
    return _wm_cost(pair).numpy(), pair[0]


def _lapjvs(cost: np.ndarray) -> np.ndarray:
    import lap

    _, cols = lap.lapjvs(-cost, return_cost=False, prefer_float32=False)
    return np.asarray(cols)


def time_assignments(kind: str, n: int, repeats: int, pairs: dict) -> dict:
    """One matrix, each solver ``repeats`` times, alternating."""
    cost, source = _matrix(kind, n, np.random.default_rng(n), pairs)
    tensor = torch.from_numpy(cost)
    solvers = {b: (lambda b=b: solve_assignment(tensor, b).numpy()) for b in BACKENDS} | {
        "lapjvs": lambda: _lapjvs(cost)
    }
    times: dict[str, list[float]] = {name: [] for name in solvers}
    values = {}
    for _ in range(repeats):
        for name, solve in solvers.items():
            start = time.perf_counter()
            cols = solve()
            times[name].append(time.perf_counter() - start)
            values[name] = float(cost[np.arange(n), cols].sum())
    median = {name: statistics.median(t) for name, t in times.items()}
    same = {name: abs(v - values["scipy"]) <= 1e-12 * abs(values["scipy"]) + 1e-9 for name, v in values.items()}
    return {
        "kind": kind,
        "n": n,
        **({"source": source} if source else {}),
        "median_s": median,
        "ratio_lapx": median["lapx"] / median["scipy"],
        "ratio_lapjvs": median["lapjvs"] / median["scipy"],
        "same_optimum": {"lapx": same["lapx"], "lapjvs": same["lapjvs"]},
    }


def _rebasin(config, params_a: dict, params_b: dict):
    """A call of git-re-basin's ``weight_matching`` on the pair (its flax layout: ``Dense_i/kernel`` is
    ``Wᵀ``), returning lmclab's permutation."""
    import jax.numpy as jnp
    from jax import random
    from weight_matching import mlp_permutation_spec
    from weight_matching import weight_matching as rebasin_wm

    def flax(params: dict) -> dict:
        out = {}
        for i in range(config.hidden + 1):
            name = f"layers.{i}" if i < config.hidden else "out"
            out[f"Dense_{i}/kernel"] = jnp.asarray(params[f"{name}.weight"].T.numpy())
            out[f"Dense_{i}/bias"] = jnp.asarray(params[f"{name}.bias"].numpy())
        return out

    spec, a, b = mlp_permutation_spec(config.hidden), flax(params_a), flax(params_b)

    def run() -> dict:
        perm = rebasin_wm(random.PRNGKey(0), spec, a, b, silent=True)
        return {g: torch.from_numpy(np.array(p)).long() for g, p in perm.items()}

    return run


def timed_wm(spec, params_a: dict, params_b: dict, **options) -> tuple:
    """``weight_matching(spec, θa, θb, **options)``, its seconds and the seconds of them in the assignment
    solver (WM looks its solver up at each call, so it is wrapped for the call)."""
    spent, solve = [0.0], wm_module.solve_assignment

    def timed(cost, backend):
        start = time.perf_counter()
        out = solve(cost, backend)
        spent[0] += time.perf_counter() - start
        return out

    wm_module.solve_assignment = timed
    try:
        start = time.perf_counter()
        result = weight_matching(spec, params_a, params_b, **options)
        seconds = time.perf_counter() - start
    finally:
        wm_module.solve_assignment = solve
    return result, seconds, spent[0]


def time_wm(pair: tuple[str, object, dict, dict], repeats: int, rebasin: bool = False) -> dict:
    """WM (library defaults) on one pair with each backend (and git-re-basin's), alternating."""
    source, config, params_a, params_b = pair
    spec = get_arch("mlp").permutation_spec(config)
    runners = [*BACKENDS, "git-re-basin"] if rebasin else list(BACKENDS)
    times: dict[str, list[float]] = {b: [] for b in runners}
    solving: dict[str, list[float]] = {b: [] for b in BACKENDS}
    found, peer = {}, _rebasin(config, params_a, params_b) if rebasin else None
    for _ in range(repeats):
        if peer is not None:
            start = time.perf_counter()
            peer_perm = peer()
            times["git-re-basin"].append(time.perf_counter() - start)
        for backend in BACKENDS:
            found[backend], seconds, assigning = timed_wm(spec, params_a, params_b, lap_backend=backend)
            times[backend].append(seconds)
            solving[backend].append(assigning)
    median = {b: statistics.median(t) for b, t in times.items()}
    objective = {b: r.stats["objective"][-1] for b, r in found.items()}
    if peer is not None:
        objective["git-re-basin"] = matching_objective(spec, peer_perm, params_a, params_b)
    return {
        "model": f"mlp {config.hidden} x {config.width}, {source}",
        "median_s": median,
        "median_assignment_s": {b: statistics.median(t) for b, t in solving.items()},
        "ratio_lapx": median["lapx"] / median["scipy"],
        "assignments": {b: r.stats["assignments"] for b, r in found.items()},
        "objective": objective,
        "same_permutation": all(torch.equal(found["scipy"].perm[g], p) for g, p in found["lapx"].perm.items()),
    }


def main(
    models: list[Path] = typer.Option([ROOT / "data/models"], help="folders with seed0.pt and seed1.pt (MLPs)"),
    wm_models: list[Path] = typer.Option([ROOT / "data/models"], help="the pairs WM is timed on (same layout)"),
    repeats: int = typer.Option(3, min=1, help="timings per solver and matrix, and per backend and WM pair"),
    sizes: str = typer.Option(",".join(map(str, SIZES)), help="comma-separated matrix sizes"),
    rebasin: Path | None = typer.Option(None, help="a folder with git-re-basin's weight_matching.py (see above)"),
    site: Path | None = typer.Option(None, help="a folder with jax, searched after the venv"),
    threads: str = typer.Option("", help="comma-separated torch thread counts to time WM with (default: torch's)"),
    out: Path = typer.Option(ROOT / "benchmarks/results/lap.json"),
) -> None:
    torch.set_grad_enabled(False)
    counts = [int(t) for t in threads.split(",") if t.strip()] or [torch.get_num_threads()]
    if counts == [1]:  # XLA's CPU thread pool too (read when jax is first imported)
        os.environ["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    sys.path += [str(p) for p in (rebasin, site) if p is not None]
    pairs = _pairs([m for m in models if (m / "seed0.pt").is_file() and (m / "seed1.pt").is_file()])
    # other jobs on the machine (2 cores shared): the load at the start and the end
    run, rows = this_run(repeats=repeats, load_average_1min={"start": os.getloadavg()[0]}), []
    warm = torch.randn(64, 64, dtype=torch.float64)
    for backend in BACKENDS:  # the first call imports and initialises the solver
        solve_assignment(warm, backend)
    _lapjvs(warm.numpy())
    for n in map(int, sizes.split(",")):
        for kind in ("random", "ties", "planted", "wm"):
            row = time_assignments(kind, n, repeats, pairs)
            rows.append({"table": "assignments", **row})
            typer.echo(
                f"{kind:>7} {n:>5}²: scipy {row['median_s']['scipy']:.3f} s, lapx ×{row['ratio_lapx']:.2f}"
                f" (same optimum: {row['same_optimum']['lapx']}), lapjvs ×{row['ratio_lapjvs']:.2f}"
            )
    timed = _pairs([m for m in wm_models if (m / "seed0.pt").is_file() and (m / "seed1.pt").is_file()])
    for count, width in ((c, w) for c in counts for w in sorted(timed)):
        torch.set_num_threads(count)
        row = {"torch_threads": count, **time_wm(timed[width], repeats, rebasin=rebasin is not None)}
        rows.append({"table": "weight_matching", **row})
        typer.echo(
            f"WM {row['model']}, {count} torch threads: scipy {row['median_s']['scipy']:.2f} s"
            f" ({row['median_assignment_s']['scipy']:.2f} s assigning), lapx {row['median_s']['lapx']:.2f} s"
            f" ({row['median_assignment_s']['lapx']:.2f} s; ×{row['ratio_lapx']:.2f});"
            f" same permutation: {row['same_permutation']}"
            + (f"; git-re-basin {row['median_s']['git-re-basin']:.2f} s" if rebasin else "")
        )
    run["load_average_1min"]["end"] = os.getloadavg()[0]
    record(out, rows, run=run)
    typer.echo(f"wrote {out}")


if __name__ == "__main__":
    typer.run(main)
