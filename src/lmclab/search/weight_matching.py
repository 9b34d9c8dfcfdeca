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

import math
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
from lmclab.core.progress import note, tick
from lmclab.core.shards import ShardedWeights
from lmclab.core.spec import (
    Permutation,
    PermutationSpec,
    entry_shape,
    group_slices,
    identity_permutation,
    random_permutation,
    unit_rows,
)
from lmclab.search.result import SearchResult
from lmclab.search.wm_costs import (
    SLICE,
    TermCache,
    constant_terms,
    cost_dependencies,
    entry_slices,
    group_cost,
    matching_objective,
)
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
    a cost no other group's permutation changes (module docstring); the costs of one tie at a time in memory."""
    sizes = spec.group_sizes(params_a)
    perm = identity_permutation(sizes)
    for unit in tie_sets(sizes, spec.heads):
        costs = {g: _signature_cost(spec, g, params_a, params_b) for g in unit}
        if all(c is not None for c in costs.values()):
            perm.update(solve_tied(costs, spec.heads, solve))
    return perm


def _signature_cost(
    spec: PermutationSpec, group: str, params_a: Mapping[str, Tensor], params_b: Mapping[str, Tensor]
) -> Tensor | None:
    """``C[i, j] = Σ ⟨sort(w^a_i), sort(w^b_j)⟩`` of ``group`` (None when it acts on running statistics only)."""
    cost = None
    for name, axis in spec.groups[group]:
        if name in spec.stats:
            continue
        w_a, w_b = params_a[name], params_b[name]
        for where in group_slices(spec.axes[name][axis], group, w_a.shape[axis]):
            (sig_a, scale), (sig_b, _) = _signatures(w_a, axis, where), _signatures(w_b, axis, where)
            cost = scale * sig_a @ sig_b.T if cost is None else cost + scale * sig_a @ sig_b.T
    return cost


def is_relabelling(spec: PermutationSpec, params_a: Mapping[str, Tensor], params_b: Mapping[str, Tensor]) -> bool:
    """Whether every matched entry of θb holds θa's values in some order (a planted copy θb = π(θa)): the
    same smallest and largest value, and sum and norm equal to 1e-9 (float64 sums, over slices of a large entry:
    :func:`lmclab.search.wm_costs.entry_slices`; a reordering changes only their rounding)."""
    for name in spec.matched_names(params_a):
        found = _statistics(spec, name, params_a, params_b)
        if found is None:  # an integer or empty entry
            continue
        (low_a, high_a, sum_a, norm_a), (low_b, high_b, sum_b, norm_b) = found
        if low_a != low_b or high_a != high_b:
            return False
        size = entry_shape(params_a, name).numel()
        if abs(norm_a - norm_b) > 1e-9 * norm_a or abs(sum_a - sum_b) > 1e-9 * norm_a * size**0.5:
            return False
    return True


def _statistics(
    spec: PermutationSpec, name: str, params_a: Mapping[str, Tensor], params_b: Mapping[str, Tensor], size: int = 2**22
) -> list[tuple[float, float, float, float]] | None:
    """The entry's smallest and largest value, sum and norm (float64) in θa and in θb, read a slice at a time and
    summed over pieces of ``size`` (no float64 copy of it); None for an integer or empty entry."""
    found = [[math.inf, -math.inf, 0.0, 0.0], [math.inf, -math.inf, 0.0, 0.0]]
    for parts in entry_slices(spec, name, None, params_a, params_b):
        for kept, part in zip(found, parts, strict=True):
            if not (part.is_floating_point() and part.numel()):
                return None
            flat = part.reshape(-1)
            kept[0], kept[1] = min(kept[0], float(flat.min())), max(kept[1], float(flat.max()))
            for start in range(0, flat.numel(), size):
                piece = flat[start : start + size].double()
                kept[2], kept[3] = kept[2] + float(piece.sum()), kept[3] + float(torch.dot(piece, piece))
    return [(low, high, total, square**0.5) for low, high, total, square in found]


def _signatures(value: Tensor, axis: int, where: tuple[int, ...]) -> tuple[Tensor, float]:
    """The rows of the units of ``where`` (:func:`lmclab.core.spec.unit_rows`) each sorted — at most ``SIGNATURE``
    evenly spaced order statistics of it — and the factor that scales their inner products to the full rows'
    (module docstring); sorted a few units at a time (rows of about a slice, :data:`SLICE`, and no copy of all)."""
    offset, length, block, copies, run = where
    units = length // (block * copies)
    step = units if copies > 1 else max(1, SLICE * block // max(value.numel() // value.shape[axis] * block, 1))
    parts, row = [], 0
    for start in range(0, units, step):  # copies interleave their units: all at once
        stretch = (offset + start * block, min(step, units - start) * block) if copies == 1 else (offset, length)
        rows = unit_rows(value, axis, *stretch, block, copies, run)
        ranked, row = rows.sort(dim=1).values, rows.shape[1]
        if row > SIGNATURE:
            ranked = ranked[:, torch.linspace(0, row - 1, SIGNATURE, device=rows.device).round().long()]
        parts.append(ranked)
    return torch.cat(parts), (row / SIGNATURE if row > SIGNATURE else 1.0)


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
    streamed = isinstance(params_a, ShardedWeights)  # read lazily: its terms (every start's) would outgrow memory
    cache = TermCache(spec, params_a, params_b, keep_bytes=0 if streamed else math.inf)
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


def _read(params_a: Mapping[str, Tensor], params_b: Mapping[str, Tensor]) -> dict[str, str]:
    """The bytes read so far from checkpoints read lazily, for the progress bar (none for models in memory)."""
    lazy = [p for p in (params_a, params_b) if isinstance(p, ShardedWeights)]
    return {"read": f"{sum(p.bytes_read for p in lazy) / 1e9:.2f} GB"} if lazy else {}


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
        for i, k in enumerate(torch.randperm(len(units), generator=generator).tolist()):
            unit, step = units[k], step + 1
            if solved_at[unit] >= max((changed_at[g] for g in depends[unit]), default=0):
                continue  # same cost as at the last solve, hence the same optimum
            if streamed := _read(params_a, params_b):  # a search of minutes: which group, what was read
                note(group=f"{i + 1}/{len(units)}", **streamed)
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
