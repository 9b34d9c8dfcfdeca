"""Weight matching, WM (Ainsworth et al. 2023).

``argmin_π Σ_ℓ ‖W^a_ℓ − P_ℓ W^b_ℓ P_{ℓ-1}ᵀ‖²`` (biases and norm parameters included), i.e.
``argmax_π ⟨θa, π(θb)⟩``. Coordinate descent: visit the permutation groups in random order; for
one group, with all others fixed, the objective is linear in ``P`` with cost
``C = Σ_{(w, axis) ∈ group} W^a_(axis) · (W^b permuted on its other axes)_(axis)ᵀ`` and the best
``P`` is a linear assignment problem (solved by ``lap_backend``, :mod:`lmclab.core.assignment`; for the
headed groups of attention, tied by a shared head order, one structured assignment solved exactly by
:func:`lmclab.core.heads.solve_tied`). Stop when
a full sweep raises the objective by no more than ``tol`` relative to it, or after ``max_iter``
sweeps. Data-free. A spec with orthogonal groups is matched by :mod:`lmclab.search.wm_orthogonal` (an
orthogonal group's step is orthogonal Procrustes instead of an assignment).

Shortcuts that leave the plain loop's result: a group's assignment is re-solved only when a permutation
its cost depends on changed since it was last solved (an unchanged cost has the same optimum; near
convergence most groups are skipped), and each term of a cost is kept between solves — reused while
the permutations of its other axes are unchanged, updated by the few slices that moved, recomputed
otherwise (:class:`lmclab.search.wm_costs.TermCache`; an update equals the recomputed term up to
floating-point rounding) — as is each entry's share of ⟨θa, π(θb)⟩.

Coordinate descent stops in local optima (on planted copies θb = π(θa) of MobileNet or EfficientNet it
ends far from π⁻¹ from the identity). It starts from the identity (or ``init_perm``) — or, when θb is a
*relabelling* of θa (every entry holds the same values, :func:`is_relabelling`: a planted copy), from the
*sorted-signature* start; ``restarts`` > 1 adds the other of the two, then random permutations, and keeps
the highest ⟨θa, π(θb)⟩. The sorted-signature start: each group solved alone
with ``C[i, j] = ⟨sort(w^a_i), sort(w^b_j)⟩``, where ``w_i`` is everything unit ``i`` touches and sorting
makes it blind to every other group's permutation; on a planted copy this is the exact π⁻¹ whenever the
units' sorted values differ, since ``Σ_i ⟨s_i, s_p(i)⟩ ≤ Σ_i ‖s_i‖²`` with equality only at the truth. A
unit's row longer than ``SIGNATURE`` values is represented by that many evenly spaced order statistics
(its inner products scaled by the row's length over them): the same argument holds for them, and the
products shrink to ``SIGNATURE`` columns (sorting the full rows remains). Starts that end at different
objectives warn (:class:`LocalOptimaWarning`).

Why one start by default: on independent pairs (``benchmarks/bench_wm_sizes.py``: a trained MLP,
ResNet20×16, VGG11-BN, ResNet50, ViT-B/16) the second start raised ⟨θa, π(θb)⟩ by at most about a tenth
of a percent and made the search 2.6 to 13 times as long — sorting every unit's values, and assignments
on those nearly flat costs, dominate it — while on a relabelling the sorted-signature start is exact, so
it comes first there.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping
from functools import partial
from typing import Any

import torch
from torch import Tensor

from lmclab.core.assignment import AssignmentOptions, solve_assignment
from lmclab.core.callers import caller_level
from lmclab.core.heads import solve_tied, tie_sets
from lmclab.core.options import Count, NonNegative, option, takes
from lmclab.core.progress import tick
from lmclab.core.spec import (
    Permutation,
    PermutationSpec,
    group_slices,
    identity_permutation,
    random_permutation,
    unit_rows,
)
from lmclab.search.result import SearchResult
from lmclab.search.wm_costs import TermCache, constant_terms, cost_dependencies, group_cost, matching_objective
from lmclab.search.wm_orthogonal import orthogonal_groups, orthogonal_matching

__all__ = ["LocalOptimaWarning", "WMOptions", "group_cost", "constant_terms", "matching_objective", "weight_matching"]


SIGNATURE = 1024  # order statistics per unit in the sorted-signature start (module docstring)


class WMOptions(AssignmentOptions):
    """Options of :func:`weight_matching`."""

    max_iter: Count = option(100, "weight matching: sweeps over all permutation groups at most")
    tol: NonNegative = option(1.0e-7, "weight matching: stop when a sweep raises ⟨θa, π(θb)⟩ by ≤ this fraction")
    restarts: Count = option(
        1,
        "weight matching: starts — the identity (sorted signatures first on a relabelled copy), the other of "
        "the two, then random — the best ⟨θa, π(θb)⟩ kept",
    )


class LocalOptimaWarning(UserWarning):
    """Weight matching's starts ended at different objectives: coordinate descent stops in local optima here."""


def sorted_signature_start(
    spec: PermutationSpec, params_a: Mapping[str, Tensor], params_b: Mapping[str, Tensor], solve: Any
) -> Permutation:
    """Every group solved alone on ``C[i, j] = Σ ⟨sort(w^a_i), sort(w^b_j)⟩`` over the entries it permutes:
    a cost no other group's permutation changes (module docstring)."""
    costs = {}
    for group in spec.groups:
        cost = None
        for name, axis in spec.groups[group]:
            if name in spec.stats:
                continue
            w_a, w_b = params_a[name], params_b[name]
            for where in group_slices(spec.axes[name][axis], group, w_a.shape[axis]):
                sig_a, sig_b, scale = _signatures(unit_rows(w_a, axis, *where), unit_rows(w_b, axis, *where))
                cost = scale * sig_a @ sig_b.T if cost is None else cost + scale * sig_a @ sig_b.T
        costs[group] = cost
    sizes = spec.group_sizes(params_a)
    perm = identity_permutation(sizes)
    for unit in tie_sets(sizes, spec.heads):
        if all(costs[g] is not None for g in unit):
            perm.update(solve_tied({g: costs[g] for g in unit}, spec.heads, solve))
    return perm


def is_relabelling(spec: PermutationSpec, params_a: Mapping[str, Tensor], params_b: Mapping[str, Tensor]) -> bool:
    """Whether every matched entry of θb holds θa's values in some order (a planted copy θb = π(θa)): the
    same smallest and largest value, and sum and norm equal to 1e-9 (float64 sums; a reordering changes
    only their rounding)."""
    for name, a in spec.matched(params_a).items():
        b = params_b[name]
        if not (a.is_floating_point() and a.numel()):
            continue
        if a.amin() != b.amin() or a.amax() != b.amax():
            return False
        norm_a, norm_b = (float(torch.linalg.vector_norm(v, dtype=torch.float64)) for v in (a, b))
        sum_a, sum_b = (float(v.sum(dtype=torch.float64)) for v in (a, b))
        if abs(norm_a - norm_b) > 1e-9 * norm_a or abs(sum_a - sum_b) > 1e-9 * norm_a * a.numel() ** 0.5:
            return False
    return True


def _signatures(rows_a: Tensor, rows_b: Tensor) -> tuple[Tensor, Tensor, float]:
    """Each row sorted — at most ``SIGNATURE`` evenly spaced order statistics of it — and the factor that
    scales their inner products to the full rows' (module docstring)."""
    length = rows_a.shape[1]
    sig_a, sig_b = rows_a.sort(dim=1).values, rows_b.sort(dim=1).values
    if length <= SIGNATURE:
        return sig_a, sig_b, 1.0
    ranks = torch.linspace(0, length - 1, SIGNATURE, device=rows_a.device).round().long()
    return sig_a[:, ranks], sig_b[:, ranks], length / SIGNATURE


@takes(WMOptions)
def weight_matching(
    spec: PermutationSpec,
    params_a: Mapping[str, Tensor],
    params_b: Mapping[str, Tensor],
    *,
    options: WMOptions,
    generator: torch.Generator | None = None,
    init_perm: Mapping[str, Tensor] | None = None,
) -> SearchResult:
    """Coordinate-descent WM (options: :class:`WMOptions`) from ``options.restarts`` starts (module
    docstring), the highest ⟨θa, π(θb)⟩ kept; ``stats['objective']`` holds it after each sweep of the kept
    start, ``stats['restart_objectives']`` every start's final one."""
    start = time.perf_counter()
    generator = generator or torch.Generator().manual_seed(0)
    solve = partial(solve_assignment, backend=options.lap_backend)
    if orthogonal_groups(spec):  # Procrustes steps beside the assignments (lmclab.search.wm_orthogonal)
        return orthogonal_matching(spec, params_a, params_b, options, solve, generator, init_perm)
    sizes = spec.group_sizes(params_a)
    cache = TermCache(spec, params_a, params_b)  # every start's terms, kept between solves
    best, finals, solves = None, [], 0
    planted = init_perm is None and is_relabelling(spec, params_a, params_b)
    signature = partial(sorted_signature_start, spec, params_a, params_b, solve)
    for k in range(options.restarts):
        if k >= 2:
            init = random_permutation(sizes, generator, spec.heads)
        elif (k == 0) == planted:  # the sorted signatures: first on a relabelling, else second
            init = signature()
        else:
            init = dict(init_perm) if init_perm is not None else identity_permutation(sizes)
        perm, objective, count = _descend(spec, params_a, params_b, init, cache, options, solve, generator)
        finals.append(objective[-1])
        solves += count
        if best is None or objective[-1] > best[1][-1]:
            best = (perm, objective, k)
    _warn_if_starts_disagree(finals, options.tol)
    perm, objective, kept = best
    stats = {"objective": objective, "sweeps": len(objective) - 1, "assignments": solves, "restart_objectives": finals}
    stats["first_start"] = "sorted signatures" if planted else "init_perm" if init_perm is not None else "identity"
    stats["products"] = dict(cache.counts)  # cost terms kept, updated and recomputed (lmclab.search.wm_costs)
    return SearchResult(
        perm, {**stats, "kept_start": kept, "lap_backend": options.lap_backend, "seconds": time.perf_counter() - start}
    )


def _warn_if_starts_disagree(finals: list[float], tol: float) -> None:
    if max(finals) - min(finals) > tol * abs(max(finals)):
        warnings.warn(
            f"weight matching: its {len(finals)} starts ended at different ⟨θa, π(θb)⟩ ({min(finals):.6g} to "
            f"{max(finals):.6g}); coordinate descent stops in local optima on this pair, the highest is kept",
            LocalOptimaWarning,
            stacklevel=caller_level(),
        )


def _descend(
    spec: PermutationSpec,
    params_a: Mapping[str, Tensor],
    params_b: Mapping[str, Tensor],
    perm: Permutation,
    cache: TermCache,
    options: WMOptions,
    solve: Any,
    generator: torch.Generator,
) -> tuple[Permutation, list[float], int]:
    """Coordinate descent from ``perm`` to a sweep that gains no more than ``options.tol``: the permutation,
    the objective after each sweep, the assignments solved (module docstring)."""
    perm = dict(perm)
    units = tie_sets(spec.group_sizes(params_a), spec.heads)  # a group alone, or the headed groups of one tie
    depends = {u: frozenset().union(*(cost_dependencies(spec, g) for g in u)) for u in units}
    changed_at = dict.fromkeys(perm, 0)  # step at which each group's permutation last changed
    solved_at = dict.fromkeys(units, -1)  # step at which each unit was last solved
    objective, step, solves = [cache.objective(perm)], 0, 0
    for _ in range(options.max_iter):
        for k in torch.randperm(len(units), generator=generator).tolist():
            unit, step = units[k], step + 1
            if solved_at[unit] >= max((changed_at[g] for g in depends[unit]), default=0):
                continue  # same cost as at the last solve, hence the same optimum
            costs = {g: cache.cost(g, perm) for g in unit}
            new = solve_tied(costs, spec.heads, solve)
            solved_at[unit], solves = step, solves + 1
            for g in unit:
                if not torch.equal(new[g], perm[g]):
                    perm[g], changed_at[g] = new[g], step
        objective.append(cache.objective(perm))
        tick(objective=f"{objective[-1]:.4g}")  # one sweep
        if objective[-1] - objective[-2] <= options.tol * abs(objective[-2]):
            break
    return perm, objective, solves
