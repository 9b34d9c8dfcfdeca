"""MergeMany (Ainsworth et al. 2023, Algorithm 3): align N models to each other with WM.

Repeatedly, for each model i in random order, align θ_i by weight matching to the mean of the
other (already aligned) models ``θ̄_{−i}``, warm-started from its current permutation. With the
others fixed, ``Σ_{j≠i} ‖π_i(θ_i) − θ_j‖² = const − 2(N−1)⟨π_i(θ_i), θ̄_{−i}⟩`` (permutations keep
‖θ_i‖), so each step can only lower the **summed squared distance to the mean**
``D = Σ_i ‖π_i(θ_i) − θ̄‖² = (1/N) Σ_{i<j} ‖π_i(θ_i) − π_j(θ_j)‖²``. Stop when an iteration lowers D
by no more than ``tol`` relative to it, or after ``max_iter`` iterations.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from lmclab.core.assignment import AssignmentOptions
from lmclab.core.options import Count, NonNegative, OptionError, option, takes
from lmclab.core.progress import tick
from lmclab.core.spec import Params, Permutation, PermutationSpec, apply_permutation, identity_permutation
from lmclab.search.universe import UniverseResult, mean_params, summed_distance, universe_result
from lmclab.search.weight_matching import weight_matching

MergeManyResult = UniverseResult  # perms, merged, stats (the shared result of the n-model methods)


class MergeManyOptions(AssignmentOptions):
    """Options of :func:`merge_many`."""

    max_iter: Count = option(20, "MergeMany: passes over all models at most")
    tol: NonNegative = option(1.0e-7, "MergeMany: stop when a pass lowers Σ‖π_i(θ_i) − θ̄‖² by ≤ this fraction")
    wm_max_iter: Count = option(100, "MergeMany: weight-matching sweeps per model and pass at most")


@takes(MergeManyOptions)
def merge_many(
    spec: PermutationSpec,
    params: Sequence[Mapping[str, Tensor]],
    *,
    options: MergeManyOptions,
    generator: torch.Generator | None = None,
) -> MergeManyResult:
    """Align ``params`` (N ≥ 2 models) to each other and average them (options: :class:`MergeManyOptions`)."""
    if len(params) < 2:
        raise OptionError(f"{{params}} must name at least 2 models, got {len(params)}")
    max_iter, tol = options.max_iter, options.tol
    start = time.perf_counter()
    generator = generator or torch.Generator().manual_seed(0)
    perms = [identity_permutation(spec.group_sizes(p)) for p in params]
    aligned = [dict(p) for p in params]
    distance, assignments = [summed_distance(spec, aligned)], 0
    for _ in range(max_iter):
        assignments += _align_each(spec, params, perms, aligned, generator, options)
        distance.append(summed_distance(spec, aligned))
        tick(distance=f"{distance[-1]:.4g}")  # one pass over the models
        if distance[-2] - distance[-1] <= tol * abs(distance[-2]):
            break
    stats = {
        "distance": distance,
        "iterations": len(distance) - 1,
        "assignments": assignments,
        "lap_backend": options.lap_backend,
        "seconds": time.perf_counter() - start,
    }
    return universe_result(spec, perms, params, stats)


def _align_each(
    spec: PermutationSpec,
    params: Sequence[Mapping[str, Tensor]],
    perms: list[Permutation],
    aligned: list[Params],
    generator: torch.Generator,
    options: MergeManyOptions,
) -> int:
    """One pass: each model in random order aligned by WM to the mean of the others, warm-started from its
    permutation; ``perms`` and ``aligned`` are updated in place. Returns the assignments solved."""
    assignments = 0
    for i in torch.randperm(len(params), generator=generator).tolist():
        others = mean_params([aligned[j] for j in range(len(params)) if j != i])
        found = weight_matching(
            spec,
            others,
            params[i],
            max_iter=options.wm_max_iter,
            tol=0.0,
            generator=generator,
            init_perm=perms[i],
            lap_backend=options.lap_backend,
            restarts=1,  # warm-started from the model's current permutation
        )
        perms[i], assignments = found.perm, assignments + found.stats["assignments"]
        aligned[i] = apply_permutation(spec, perms[i], params[i])
    return assignments
