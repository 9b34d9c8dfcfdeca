"""The measure stage's work on one pair against the bare forward passes it needs.

After `dvc repro`, for one pair and every method of ``params.yaml``: the library work of the measure
stage (``measure_and_analyze`` with θa's and θb's SVDs shared, as ``lmclab.analysis.pair`` runs it for the stage), and
the bare minimum its curves need — one forward pass per λ of the grid, method and split over every
image, no loss, no bookkeeping — timed in the same process, interleaved per repeat. Prints both, the
ratio, and where the rest goes (Taylor, R_γ, Theorem 4.2).

    python benchmarks/bench_measure.py [--pair 0-1] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import yaml
from torch.func import functional_call

from lmclab.analysis.compose import Analysis, Endpoints, measure_and_analyze
from lmclab.archs import build_model, get_arch
from lmclab.archs.checkpoint import load_checkpoint
from lmclab.core.data import load_split
from lmclab.core.merge import lerp_params
from lmclab.core.metrics import lambda_grid

ROOT = Path(__file__).resolve().parent.parent


@torch.no_grad()
def bare_forwards(model, params_a, permuted, lams, splits) -> None:
    model.eval()
    for permuted_b in permuted.values():
        for lam in lams:
            params = lerp_params(params_a, permuted_b, lam)
            for split in splits.values():
                for lo in range(0, len(split), 1024):
                    functional_call(model, params, (split.x[lo : lo + 1024],))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="0-1")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    seed_a, seed_b = args.pair.split("-")
    a, b = (load_checkpoint(ROOT / "data" / "models" / f"seed{s}.pt") for s in (seed_a, seed_b))
    merged = ROOT / "data" / "merged" / f"seed{seed_a}-seed{seed_b}"
    methods = params["permute"]["methods"]
    permuted = {m: load_checkpoint(merged / m / "permuted_b.pt").state_dict for m in methods}
    midpoints = {m: load_checkpoint(merged / m / "midpoint.pt").state_dict for m in methods}
    splits = {s: load_split(ROOT / "data" / "prepared", s) for s in ("train", "test")}
    model, spec = build_model(a.arch, a.config), get_arch(a.arch).permutation_spec(a.config)
    lams, opts = lambda_grid(params["measure"]["num_lambdas"]), params["measure"]

    def stage_work() -> None:
        how = Analysis(
            lams=lams,
            gammas=opts["gammas"],
            input_shape=a.config.input_shape,
            mode=opts["conv_spectrum"],
            taylor_splits=opts["taylor_splits"],
        )
        bare = Endpoints(spec, model, a.state_dict, b.state_dict, splits)
        shared = [how.factors(bare, p) for p in (a.state_dict, b.state_dict)]
        pair = Endpoints(spec, model, a.state_dict, b.state_dict, splits, *shared)
        for m in methods:
            measure_and_analyze(pair, permuted[m], midpoints[m], how)

    times: dict[str, list[float]] = {"stage": [], "bare": []}
    for _ in range(args.repeats):
        for name, fn in (
            ("bare", lambda: bare_forwards(model, a.state_dict, permuted, lams, splits)),
            ("stage", stage_work),
        ):
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    stage, bare = statistics.median(times["stage"]), statistics.median(times["bare"])
    images = len(methods) * len(lams) * sum(len(s) for s in splits.values())
    print(
        f"pair {args.pair}, {len(methods)} methods × {len(lams)} λ × {sum(len(s) for s in splits.values())} "
        f"images = {images} image forwards; threads {torch.get_num_threads()}"
    )
    print(
        f"measure work {stage:.2f} s, bare forward passes {bare:.2f} s: ratio {stage / bare:.2f} "
        f"(repeats: stage {[round(t, 2) for t in times['stage']]}, bare {[round(t, 2) for t in times['bare']]})"
    )


if __name__ == "__main__":
    main()
