"""Benchmark: weight matching at real model sizes, lmclab beside git-re-basin's ``weight_matching`` on the
same weights, timed alternating in one process (medians of ``--repeats``).

    python benchmarks/bench_wm_sizes.py --models mlp,vgg11_bn,resnet20x16,resnet50,vit_b_16 --repeats 3 \
        --rebasin /tmp/git-re-basin --site /tmp/jax-site

Models: ``mlp`` — the default run's trained pair (``data/models`` seed0.pt, seed1.pt: run ``make pipeline``
first); ``resnet20x16`` — the paper's CIFAR ResNet20 at width ×16 (lmclab's own, random init seeds 0, 1);
``vgg11_bn``, ``resnet50``, ``vit_b_16`` — torchvision's, random init seeds 0 and 1 (no weights are
downloaded). The spec is the one lmclab traces (``lmclab.trace``).

Each model is matched by
* ``lmclab`` — :func:`lmclab.search.weight_matching` with its defaults: one start from the identity on
  these independent pairs, the peer's algorithm (coordinate descent over the groups in random order
  until a sweep improves nothing);
* ``lmclab 2 starts`` — ``restarts=2``: the identity, then the sorted-signature start, the better kept;
* ``git-re-basin`` — its ``weight_matching`` (JAX in float32, scipy's solver) on the same state dicts in
  its own spec format (``--rebasin DIR``: a folder with its ``src/weight_matching.py`` and a ``utils.py``
  holding its one-line ``rngmix``; jax from ``--site``; nothing of it enters lmclab; ``bench_lap.py`` says
  how to get both). A flattened conv→linear axis becomes an axis of units and one of positions, which
  is the same objective. Models with packed or headed axes (``vit_b_16``'s attention) have no spec in its
  format and are timed for lmclab only.

With ``--append`` the rows of the models not timed now are kept (each row names its run: command,
commit, date, machine, repeats), so the large models can be timed with fewer repeats than the small.

Each row: seconds (median), the final ⟨θa, π(θb)⟩ of each (the peer's permutation scored by lmclab),
lmclab's sweeps, assignments, seconds in the assignment solver and its cost terms kept / updated /
recomputed (``lmclab.search.wm_costs``). ``--threads``: torch's intra-op threads (default: lmclab's
policy, ``lmclab.core.threads``). Writes ``benchmarks/results/wm_sizes.json`` with the command, commit,
date and machine; the performance page (``tools/performance_page.py``) is generated from it.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import typer
from record import record, this_run  # benchmarks/record.py: the one shape of a result

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("mlp", "resnet20x16", "vgg11_bn", "resnet50", "vit_b_16")


def load_pair(name: str, models: Path):
    """``(spec, θa, θb, source)`` of one model (module docstring)."""
    import torch

    from lmclab.archs import build_model, get_arch, make_config
    from lmclab.archs.checkpoint import load_checkpoint

    if name == "mlp":
        a, b = (load_checkpoint(models / f"seed{s}.pt") for s in (0, 1))
        spec = get_arch(a.arch).permutation_spec(a.config)
        return spec, a.state_dict, b.state_dict, f"trained ({models}: seed0, seed1)"
    if name == "resnet20x16":
        config = make_config("resnet20", input_shape=(3, 32, 32), num_classes=10, width_multiplier=16)
        a, b = (dict(build_model("resnet20", config, seed=s).state_dict()) for s in (0, 1))
        return get_arch("resnet20").permutation_spec(config), a, b, "random init (seeds 0, 1)"
    import torchvision

    from lmclab.trace import trace

    def build(seed: int) -> torch.nn.Module:
        torch.manual_seed(seed)
        return torchvision.models.get_model(name, weights=None).eval()

    net_a, net_b = build(0), build(1)
    spec = trace(net_a, torch.randn(2, 3, 224, 224)).spec
    return spec, dict(net_a.state_dict()), dict(net_b.state_dict()), "torchvision, random init (seeds 0, 1)"


def size_columns(name: str, source: str, spec, params: dict) -> dict:
    """A model's row head: its name, where its weights come from, parameters (running statistics left out),
    permutation groups and the widest group's size."""
    sizes = spec.group_sizes(params)
    return {
        "model": name,
        "source": source,
        "parameters": sum(v.numel() for k, v in params.items() if k not in spec.stats),
        "groups": len(sizes),
        "widest_group": max(sizes.values()),
    }


def rebasin_runner(spec, params_a: dict, params_b: dict) -> Callable[[], dict] | None:
    """git-re-basin's ``weight_matching`` on the pair in its spec format, returning lmclab's
    permutation; None when an axis is packed or headed (no spec in its format)."""
    import numpy as np
    import torch

    from lmclab.core.spec import segments

    if spec.heads:
        return None
    axes, shapes = {}, {}
    for name, entries in spec.axes.items():
        if name in spec.stats or not any(entries):
            continue
        value, shape, perms = params_a[name], [], []
        for axis, entry in enumerate(entries):
            if entry is None or isinstance(entry, str):
                shape.append(value.shape[axis])
                perms.append(entry)
                continue
            parts = segments(entry, value.shape[axis])
            if len(parts) != 1 or parts[0].group is None:
                return None  # packed: several stretches on one axis
            shape += [value.shape[axis] // parts[0].block, parts[0].block]
            perms += [parts[0].group, None]
        axes[name], shapes[name] = tuple(perms), tuple(shape)
    import jax.numpy as jnp
    from jax import random
    from weight_matching import permutation_spec_from_axes_to_perm
    from weight_matching import weight_matching as peer

    peer_spec = permutation_spec_from_axes_to_perm(axes)
    a, b = ({k: jnp.asarray(p[k].reshape(shapes[k]).float().numpy()) for k in axes} for p in (params_a, params_b))

    def run() -> dict:
        perm = peer(random.PRNGKey(0), peer_spec, a, b, silent=True)
        return {g: torch.from_numpy(np.array(p)).long() for g, p in perm.items()}

    return run


def time_model(name: str, models: Path, repeats: int, rebasin: bool) -> dict:
    """One model's row (module docstring)."""
    import torch
    from bench_lap import timed_wm

    from lmclab.search.weight_matching import matching_objective

    spec, params_a, params_b, source = load_pair(name, models)
    peer = rebasin_runner(spec, params_a, params_b) if rebasin else None
    runs = {"lmclab": {}, "lmclab 2 starts": {"restarts": 2}}
    times: dict[str, list[float]] = {k: [] for k in [*runs, *(["git-re-basin"] if peer else [])]}
    assigning: dict[str, list[float]] = {k: [] for k in runs}
    found: dict[str, object] = {}
    for _ in range(repeats):
        for label, options in runs.items():
            found[label], seconds, solving = timed_wm(spec, params_a, params_b, **options)
            times[label].append(seconds)
            assigning[label].append(solving)
        if peer is not None:
            start = time.perf_counter()
            found["git-re-basin"] = peer()
            times["git-re-basin"].append(time.perf_counter() - start)
    median = {k: statistics.median(t) for k, t in times.items()}
    objective = {k: matching_objective(spec, getattr(v, "perm", v), params_a, params_b) for k, v in found.items()}
    return {
        **size_columns(name, source, spec, params_a),
        "median_s": median,
        "speedup_vs_git_re_basin": {k: median["git-re-basin"] / median[k] for k in runs} if peer else None,
        "objective": objective,
        "median_assignment_s": {k: statistics.median(t) for k, t in assigning.items()},
        "sweeps": {k: found[k].stats["sweeps"] for k in runs},
        "assignments": {k: found[k].stats["assignments"] for k in runs},
        "products": {k: found[k].stats["products"] for k in runs},
        "restart_objectives": found["lmclab 2 starts"].stats["restart_objectives"],
        "torch_threads": torch.get_num_threads(),
        "git_re_basin": "timed" if peer else ("no spec in its format" if rebasin else "not given (--rebasin)"),
    }


def main(
    models: str = typer.Option(",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}"),
    pair: Path = typer.Option(ROOT / "data/models", help="the folder of the mlp pair (seed0.pt, seed1.pt)"),
    repeats: int = typer.Option(3, min=1, help="timings of each matcher per model, alternating"),
    rebasin: Path | None = typer.Option(None, help="a folder with git-re-basin's weight_matching.py (see above)"),
    site: Path | None = typer.Option(None, help="a folder with jax, searched after the venv"),
    threads: str = typer.Option("auto", help="torch intra-op threads: a count, or auto (lmclab's policy)"),
    append: bool = typer.Option(False, help="keep --out's rows of the other models (and their runs)"),
    out: Path = typer.Option(ROOT / "benchmarks/results/wm_sizes.json"),
) -> None:
    unknown = sorted(set(models.split(",")) - set(MODELS))
    if unknown:
        raise typer.BadParameter(f"unknown models {unknown}; choose from {list(MODELS)}", param_hint="--models")
    from lmclab.core.threads import use_threads, wait_briefly

    wait_briefly()
    sys.path += [str(p) for p in ((rebasin / "src") if rebasin else None, site) if p is not None]
    import torch

    torch.set_grad_enabled(False)
    use_threads(threads)
    run, chosen, rows = this_run(repeats=repeats), models.split(","), []
    keep = (lambda r: r["model"] not in chosen) if append else None
    for name in chosen:
        load = os.getloadavg()[0]
        row = {**time_model(name, pair, repeats, rebasin is not None), "load_average_1min": load}
        rows.append(row)
        peer = row["median_s"].get("git-re-basin")
        typer.echo(
            f"{name}: lmclab {row['median_s']['lmclab']:.2f} s (2 starts {row['median_s']['lmclab 2 starts']:.2f} s)"
            + (f", git-re-basin {peer:.2f} s" if peer else "")
            + f"; objective {row['objective']}"
        )
        record(out, rows, run=run, keep=keep)  # after each model: a long run keeps what it measured
    typer.echo(f"wrote {out}")


if __name__ == "__main__":
    typer.run(main)
