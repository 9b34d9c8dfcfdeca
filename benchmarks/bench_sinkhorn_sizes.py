"""Benchmark: what Sinkhorn weight matching (``wm_sinkhorn``, the paper's WM) costs per model size, beside
coordinate-descent weight matching on the same pair, with the library's defaults.

    python benchmarks/bench_sinkhorn_sizes.py --models mlp,vit_tiny

Models: ``mlp`` — the default run's trained pair (``data/models`` seed0.pt, seed1.pt: run ``make pipeline``
first); ``vit_tiny`` — timm's ``vit_tiny_patch16_224`` (5.7 M parameters, needs timm), random init seeds 0
and 1 (no weights are downloaded), its spec traced by ``lmclab.trace``.

Each model is matched by
* ``wm`` — :func:`lmclab.search.weight_matching` (coordinate descent, one start);
* ``wm_sinkhorn`` — :func:`lmclab.search.wm_sinkhorn` with its defaults (scores from the identity, lr 1,
  stopped after 10 scores without a better ⟨θa, π(θb)⟩), and with each ``--lrs`` value other than 1;
* ``wm_sinkhorn, init wm`` — the same started at coordinate-descent WM's permutation (``init: wm``; its
  seconds include that search).

Each row: seconds, Adam steps and seconds per step, the best ⟨θa, π(θb)⟩ of the search (what
``select: best`` returns), whether it stalled, and the median over groups of Adam's first step at lr 1
(:func:`lmclab.search.wm_sinkhorn.start_gradients`: far below 1, the scores barely move at lr 1). Writes
``benchmarks/results/sinkhorn_sizes.json`` with the command, commit, date and machine; the performance page
(``tools/performance_page.py``) is generated from it. One run per setting: a Sinkhorn search of a ViT
takes minutes.
"""

from __future__ import annotations

import statistics
import time
import warnings
from pathlib import Path

import typer
from record import record, this_run  # benchmarks/record.py: the one shape of a result

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("mlp", "vit_tiny")


def load_pair(name: str, models: Path):
    """``(spec, θa, θb, source)`` of one model (module docstring)."""
    import torch

    from lmclab.archs import get_arch
    from lmclab.archs.checkpoint import load_checkpoint

    if name == "mlp":
        a, b = (load_checkpoint(models / f"seed{s}.pt") for s in (0, 1))
        return get_arch(a.arch).permutation_spec(a.config), a.state_dict, b.state_dict, "trained (seed0, seed1)"
    import timm

    from lmclab.trace import trace

    def build(seed: int) -> torch.nn.Module:
        torch.manual_seed(seed)
        return timm.create_model("vit_tiny_patch16_224", pretrained=False).eval()

    net_a, net_b = build(0), build(1)
    spec = trace(net_a, torch.randn(2, 3, 224, 224)).spec
    return spec, dict(net_a.state_dict()), dict(net_b.state_dict()), "timm, random init (seeds 0, 1)"


def sinkhorn_row(label: str, spec, params_a, params_b, **options) -> dict:
    """One ``wm_sinkhorn`` search with ``options`` over its defaults."""
    import torch

    from lmclab.search.wm_sinkhorn import StalledSearchWarning, WMSinkhornOptions, wm_sinkhorn

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", StalledSearchWarning)  # recorded as "stalled"
        result = wm_sinkhorn(spec, params_a, params_b, generator=torch.Generator().manual_seed(0), **options)
    curve, stats = result.stats["curve"], result.stats
    steps = stats["epochs"] * WMSinkhornOptions.check(options).iterations
    return {
        "method": label,
        "options": options,
        "seconds": stats["seconds"],
        "steps": steps,
        "start_objective": curve[0]["objective"],
        "objective": max(r["objective"] for r in curve),
        "best_epoch": stats["best_epoch"],
        "stalled": stats["stalled"],
    }


def time_model(name: str, models: Path, lrs: list[float]) -> dict:
    """One model's rows (module docstring)."""
    import torch
    from bench_wm_sizes import size_columns

    from lmclab.search.weight_matching import matching_objective, weight_matching
    from lmclab.search.wm_sinkhorn import start_gradients

    spec, params_a, params_b, source = load_pair(name, models)
    first = start_gradients(spec, params_a, params_b, generator=torch.Generator().manual_seed(0))
    start = time.perf_counter()
    found = weight_matching(spec, params_a, params_b, generator=torch.Generator().manual_seed(0))
    rows = [{"method": "wm", "seconds": time.perf_counter() - start}]
    rows[0]["objective"] = matching_objective(spec, found.perm, params_a, params_b)
    for lr in lrs:
        label = "wm_sinkhorn" if lr == 1 else f"wm_sinkhorn, lr {lr:g}"
        rows.append(sinkhorn_row(label, spec, params_a, params_b, **({} if lr == 1 else {"lr": lr})))
    rows.append(sinkhorn_row("wm_sinkhorn, init wm", spec, params_a, params_b, init="wm"))
    for row in rows:
        typer.echo(f"{name}: {row['method']} {row['seconds']:.1f} s, objective {row['objective']:.2f}")
    return {
        **size_columns(name, source, spec, params_a),
        "median_first_step_rms": statistics.median(g["first_step_rms"] for g in first.values()),
        "torch_threads": torch.get_num_threads(),
        "searches": rows,
    }


def main(
    models: str = typer.Option(",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}"),
    pair: Path = typer.Option(ROOT / "data/models", help="the folder of the mlp pair (seed0.pt, seed1.pt)"),
    lrs: str = typer.Option("1", help="comma-separated Adam learning rates of the identity-started searches"),
    out: Path = typer.Option(ROOT / "benchmarks/results/sinkhorn_sizes.json"),
) -> None:
    unknown = sorted(set(models.split(",")) - set(MODELS))
    if unknown:
        raise typer.BadParameter(f"unknown models {unknown}; choose from {list(MODELS)}", param_hint="--models")
    rates = [float(x) for x in lrs.split(",")]
    if any(r <= 0 for r in rates):
        raise typer.BadParameter(f"learning rates must be > 0, got {lrs}", param_hint="--lrs")
    from lmclab.core.threads import use_threads, wait_briefly

    wait_briefly()
    use_threads("auto")
    run, rows = this_run(), []
    for name in models.split(","):
        rows.append(time_model(name, pair, rates))
        record(out, rows, run=run)  # after each model: a long run keeps what it measured
    typer.echo(f"wrote {out}")


if __name__ == "__main__":
    typer.run(main)
