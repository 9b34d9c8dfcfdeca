"""Sync: all pairwise weight matchings, then spectral permutation synchronisation (Pachauri et al.
2013).

For each pair i < j, ``π_{ij} = WM(θ_i, θ_j)`` (model j into model i's frame), as a 0/1 matrix
``M_{ij}`` (``M_{ij}[q, π_{ij}[q]] = 1``; ``M_{ji} = M_{ij}ᵀ``, ``M_{ii} = I``). Were they consistent,
``M_{ij} = U_iᵀ U_j`` with ``U_i`` model i's map into a universe, and the block matrix ``Q = [M_{ij}]``
(Nn × Nn) would be ``V Vᵀ`` with ``V = [U_1ᵀ; …; U_Nᵀ]``: rank n, eigenvalue N. Per group, the top-n
eigenvectors ``V`` of Q (any basis of that space: V R) give each model's map up to one common rotation,
fixed by model 0: ``U_i ≈ V_0 V_iᵀ`` (up to the factor N), rounded to the permutation maximising
``⟨U_i, ·⟩`` (headed groups of one tie: the structured assignment). Model 0's frame is the universe.
The result is cycle-consistent by construction; on consistent input it returns the pairwise maps.

A group of orthogonal kind (``symmetry="orthogonal"``) is synchronised alike: its pairwise maps are orthogonal
matrices ``O_ij``, ``Q = [O_ij]`` is again ``V Vᵀ`` on consistent input (the spectral synchronisation of
rotations, Singer 2011), and ``V_0 V_iᵀ`` is rounded to the nearest orthogonal map, its polar factor (inside
heads and for the other kinds, :func:`lmclab.core.heads.solve_tied`'s exact step).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from functools import partial
from itertools import combinations

import torch
from torch import Tensor

from lmclab.core.assignment import AssignmentOptions, solve_assignment
from lmclab.core.heads import solve_tied, tie_sets
from lmclab.core.options import Count, OptionError, option, takes
from lmclab.core.orthogonal import as_matrix
from lmclab.core.spec import Permutation, PermutationSpec
from lmclab.search.universe import UniverseResult, universe_result
from lmclab.search.weight_matching import weight_matching


def synchronise(pairwise: Mapping[tuple[int, int], Tensor], n_models: int, size: int) -> list[Tensor]:
    """Per model i, the score matrix ``V_0 V_iᵀ`` (size × size) of its map into model 0's frame, from the
    pairwise maps ``pairwise[(i, j)]`` (i < j, index form) of one group (module docstring)."""
    q = torch.zeros(n_models * size, n_models * size, dtype=torch.float64)
    eye = torch.eye(size, dtype=torch.float64)
    for i in range(n_models):
        q[i * size : (i + 1) * size, i * size : (i + 1) * size] = eye
    for (i, j), perm in pairwise.items():
        block = as_matrix(perm)  # M_ij: row q has its 1 at column π_ij[q]; an orthogonal map as it is
        q[i * size : (i + 1) * size, j * size : (j + 1) * size] = block
        q[j * size : (j + 1) * size, i * size : (i + 1) * size] = block.T
    _, vectors = torch.linalg.eigh(q)  # ascending: the top n are the last n columns
    top = vectors[:, -size:]
    blocks = [top[i * size : (i + 1) * size] for i in range(n_models)]
    return [blocks[0] @ b.T for b in blocks]


class SyncOptions(AssignmentOptions):
    """Options of :func:`sync`."""

    wm_max_iter: Count = option(100, "sync: weight-matching sweeps per pair at most")


@takes(SyncOptions)
def sync(
    spec: PermutationSpec,
    params: Sequence[Mapping[str, Tensor]],
    *,
    options: SyncOptions,
    generator: torch.Generator | None = None,
) -> UniverseResult:
    """Pairwise WM of every pair, synchronised (module docstring); ``stats``: ``seconds``,
    ``assignments`` (the pairwise WMs' and the rounding's), ``pairs``."""
    if len(params) < 2:
        raise OptionError(f"{{params}} must name at least 2 models, got {len(params)}")
    start, generator = time.perf_counter(), generator or torch.Generator().manual_seed(0)
    sizes = spec.group_sizes(params[0])
    wm = partial(weight_matching, max_iter=options.wm_max_iter, generator=generator, lap_backend=options.lap_backend)
    found = {(i, j): wm(spec, params[i], params[j]) for i, j in combinations(range(len(params)), 2)}
    scores = {g: synchronise({k: r.perm[g] for k, r in found.items()}, len(params), n) for g, n in sizes.items()}
    perms: list[Permutation] = []
    solve = partial(solve_assignment, backend=options.lap_backend)
    for i in range(len(params)):
        perm: Permutation = {}
        for unit in tie_sets(sizes, spec.heads):
            perm |= solve_tied({g: scores[g][i] for g in unit}, spec.heads, solve, spec.kinds)
        perms.append(perm)
    solves = sum(r.stats["assignments"] for r in found.values()) + len(params) * len(tie_sets(sizes, spec.heads))
    return universe_result(
        spec,
        perms,
        params,
        {
            "assignments": solves,
            "pairs": len(found),
            "lap_backend": options.lap_backend,
            "seconds": time.perf_counter() - start,
        },
    )
