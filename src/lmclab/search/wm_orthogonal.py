"""Weight matching over a spec with orthogonal groups (Theus et al. 2025, Section 4: weight matching with
orthogonal maps of the residual stream beside permutations of the MLP units and heads).

The objective is WM's, ``argmax ⟨θa, π(θb)⟩`` (:mod:`lmclab.search.weight_matching`), with π now holding
an orthogonal matrix for every group the spec marks ``"orthogonal"``. Coordinate descent as there: for one
group with all others fixed, the objective is ``⟨O, C_g⟩ + const`` with the same cost ``C_g``
(:func:`lmclab.search.wm_costs.group_cost`, every other group's element applied to θb); a permutation
group's best element is the assignment, an orthogonal group's the polar factor of ``C_g`` (orthogonal
Procrustes, :func:`lmclab.core.orthogonal.polar`; for a centred group, the polar factor on the complement of
the all-ones vector, :func:`lmclab.core.orthogonal.polar_centred`), and the groups of one tie of heads, each of
either kind, are solved together: one head order σ and a permutation or an orthogonal map inside each head
(:func:`lmclab.core.heads.solve_tied`). Each step is the exact optimum over its
group, so the objective never decreases; the descent stops when a sweep raises it by no more than ``tol``
relative to it.

The data-free start: every orthogonal group solved alone on its *constant terms* — the entries none of
whose other axes any group acts on, such as a transformer's token embedding and unembedding, whose
vocabulary axis never moves — then every other group (the groups of one tie of heads together) solved once, in
turn, on its cost with the groups solved before it applied and the rest at the identity (when no group has
constant terms of full rank, nothing anchors that pass, and the start is the identity). On a planted copy
``E_b = E_a O_gᵀ`` such a term is ``C = E_aᵀE_a O_gᵀ``, whose polar factor is exactly ``O_gᵀ = O_g⁻¹``
whenever ``E_a`` has full column rank (so a group is solved on its constant terms only when their sum has full
rank, which a bias alone has not); a group read only beside solved ones (an MLP's units or a layer's heads
between two uses of the stream) then has an exact cost, so the start is the planted element. (Left to the
descent instead, an orthogonal group of heads and the stream would approach it only linearly.)
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from lmclab.core.heads import solve_tied, tie_sets
from lmclab.core.orthogonal import MATRIX_KINDS, POLAR
from lmclab.core.progress import tick
from lmclab.core.spec import Permutation, PermutationSpec, identity_permutation, random_permutation
from lmclab.search.result import SearchResult
from lmclab.search.wm_costs import constant_terms, group_cost, matching_objective


def orthogonal_groups(spec: PermutationSpec) -> list[str]:
    """The groups ``spec`` marks ``"orthogonal"``, ``"centred"`` or ``"rotary"`` (elements are matrices), sorted."""
    return sorted(g for g, kind in spec.kinds.items() if kind in MATRIX_KINDS)


def constant_start(
    spec: PermutationSpec, params_a: Mapping[str, Tensor], params_b: Mapping[str, Tensor], solve: Any
) -> Permutation:
    """Every plain orthogonal group whose constant terms have full rank solved on them alone (a bias alone has
    rank 1: its polar factor is not unique), then, if any was, every other tie set solved once, in turn, on its
    cost given the groups before it (module docstring); if none was, the identity."""
    perm = identity_permutation(spec.group_sizes(params_a))
    constants, solved = constant_terms(spec, params_a, params_b), set()
    for group in sorted(set(orthogonal_groups(spec)) - set(spec.heads)):  # heads share σ: solved below
        total = sum(term for (_, _, g), term in constants.items() if g == group)
        if torch.is_tensor(total) and torch.linalg.matrix_rank(total.double()) == len(total):  # they determine it
            perm[group] = POLAR[spec.kinds[group]](total)
            solved.add(group)
    for unit in tie_sets(set(perm) - solved, spec.heads) if solved else ():  # unanchored, the identity is the start
        costs = {g: group_cost(spec, g, perm, params_a, params_b) for g in unit}
        if all(c is not None for c in costs.values()):
            perm.update(solve_tied(costs, spec.heads, solve, spec.kinds))
    return perm


def orthogonal_matching(
    spec: PermutationSpec,
    params_a: Mapping[str, Tensor],
    params_b: Mapping[str, Tensor],
    options: Any,
    solve: Any,
    generator: torch.Generator,
    init_perm: Mapping[str, Tensor] | None = None,
) -> SearchResult:
    """Coordinate descent over permutation and orthogonal groups from ``options.restarts`` starts — the
    constant-term start (or ``init_perm``), the identity, then random elements — the highest ⟨θa, π(θb)⟩
    kept (module docstring; ``options``: :class:`lmclab.search.weight_matching.WMOptions`)."""
    start, sizes = time.perf_counter(), spec.group_sizes(params_a)
    best, finals, solves = None, [], 0
    for k in range(options.restarts):
        if k == 0:
            init = dict(init_perm) if init_perm is not None else constant_start(spec, params_a, params_b, solve)
        elif k == 1:
            init = identity_permutation(sizes)
        else:
            init = random_permutation(sizes, generator, spec.heads, spec.kinds)
        perm, objective, count = _descend(spec, params_a, params_b, init, options, solve, generator)
        finals.append(objective[-1])
        solves += count
        if best is None or objective[-1] > best[1][-1]:
            best = (perm, objective, k)
    perm, objective, kept = best
    stats = {"objective": objective, "sweeps": len(objective) - 1, "restart_objectives": finals, "kept_start": kept}
    stats["assignments"] = solves  # the steps solved: assignments, and Procrustes steps of orthogonal groups
    stats["first_start"] = "init_perm" if init_perm is not None else "constant terms"
    return SearchResult(perm, {**stats, "lap_backend": options.lap_backend, "seconds": time.perf_counter() - start})


def _descend(
    spec: PermutationSpec,
    params_a: Mapping[str, Tensor],
    params_b: Mapping[str, Tensor],
    perm: Permutation,
    options: Any,
    solve: Any,
    generator: torch.Generator,
) -> tuple[Permutation, list[float], int]:
    """Coordinate descent from ``perm`` to a sweep that gains no more than ``options.tol``: the element, the
    objective after each sweep, the steps solved."""
    perm, solves = dict(perm), 0
    units = tie_sets(spec.group_sizes(params_a), spec.heads)
    objective = [matching_objective(spec, perm, params_a, params_b)]
    for _ in range(options.max_iter):
        for k in torch.randperm(len(units), generator=generator).tolist():
            costs = {g: group_cost(spec, g, perm, params_a, params_b) for g in units[k]}
            if any(c is None for c in costs.values()):
                continue  # a group acting on running statistics only: no cost
            perm.update(solve_tied(costs, spec.heads, solve, spec.kinds))
            solves += 1
        objective.append(matching_objective(spec, perm, params_a, params_b))
        tick(objective=f"{objective[-1]:.4g}")
        if objective[-1] - objective[-2] <= options.tol * abs(objective[-2]):
            break
    return perm, objective, solves
