"""Star: every model matched to model 0 by weight matching (the common n-model baseline).

``π_0`` is the identity and ``π_i = WM(θ_0, θ_i)``: model 0's frame is the universe. The maps between
two other models go through model 0 (``π_{ij} = π_j ∘ π_i⁻¹``), so they are cycle-consistent, but
nothing makes models 1 … N−1 agree with each other beyond what each shares with model 0.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from lmclab.core.assignment import AssignmentOptions
from lmclab.core.options import Count, OptionError, option, takes
from lmclab.core.spec import PermutationSpec, identity_permutation
from lmclab.search.universe import UniverseResult, universe_result
from lmclab.search.weight_matching import weight_matching


class StarOptions(AssignmentOptions):
    """Options of :func:`star`."""

    wm_max_iter: Count = option(100, "star: weight-matching sweeps per pair at most")


@takes(StarOptions)
def star(
    spec: PermutationSpec,
    params: Sequence[Mapping[str, Tensor]],
    *,
    options: StarOptions,
    generator: torch.Generator | None = None,
) -> UniverseResult:
    """Align every model to ``params[0]`` by WM; ``stats``: ``seconds``, ``assignments``."""
    if len(params) < 2:
        raise OptionError(f"{{params}} must name at least 2 models, got {len(params)}")
    start, generator = time.perf_counter(), generator or torch.Generator().manual_seed(0)
    found = [
        weight_matching(
            spec,
            params[0],
            p,
            max_iter=options.wm_max_iter,
            generator=generator,
            lap_backend=options.lap_backend,
            restarts=1,  # the common baseline: one descent per model
        )
        for p in params[1:]
    ]
    perms = [identity_permutation(spec.group_sizes(params[0]))] + [r.perm for r in found]
    stats = {
        "assignments": sum(r.stats["assignments"] for r in found),
        "lap_backend": options.lap_backend,
        "seconds": time.perf_counter() - start,
    }
    return universe_result(spec, perms, params, stats)
