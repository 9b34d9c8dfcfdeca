"""The cost matrices of weight matching's coordinate descent (:mod:`lmclab.search.weight_matching`).

For one group ``g`` with every other group fixed, ``⟨θa, π(θb)⟩`` is linear in ``P_g`` with cost
``C_g = Σ_{(w, axis) ∈ g} W^a_(axis) · (W^b permuted on its other axes)_(axis)ᵀ`` (Ainsworth et al.
2023; the paper's Section 3): one term per entry the group permutes.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor

from lmclab.core.spec import PermutationSpec, axis_index, entry_groups, group_slices, unit_rows


def _permute_other_axes(
    spec: PermutationSpec, perm: Mapping[str, Tensor], name: str, value: Tensor, skip_axis: int
) -> Tensor:
    for axis, entry in enumerate(spec.axes[name]):
        if entry_groups(entry) and axis != skip_axis:
            value = value.index_select(axis, axis_index(entry, perm, value.shape[axis]))
    return value


def _term(
    spec: PermutationSpec,
    perm: Mapping[str, Tensor],
    name: str,
    axis: int,
    group: str,
    params_a: Mapping[str, Tensor],
    params_b: Mapping[str, Tensor],
) -> Tensor:
    """``W^a_(axis) · (W^b permuted on its other axes)_(axis)ᵀ`` over the stretches ``group``
    permutes (a composite axis: one per segment, each unit's block in its row)."""
    w_a, w_b = params_a[name], _permute_other_axes(spec, perm, name, params_b[name], axis)
    term = None
    for where in group_slices(spec.axes[name][axis], group, w_a.shape[axis]):
        part = unit_rows(w_a, axis, *where) @ unit_rows(w_b, axis, *where).T
        term = part if term is None else term + part
    return term


def _is_constant(spec: PermutationSpec, name: str, axis: int) -> bool:
    """True when no other axis of ``name`` is permuted: its cost term never changes."""
    return all(not entry_groups(e) for i, e in enumerate(spec.axes[name]) if i != axis)


def group_cost(
    spec: PermutationSpec,
    group: str,
    perm: Mapping[str, Tensor],
    params_a: Mapping[str, Tensor],
    params_b: Mapping[str, Tensor],
    constants: Mapping[tuple[str, int, str], Tensor] | None = None,
) -> Tensor:
    """``C[i, j]`` = gain of mapping unit ``j`` of θb onto unit ``i`` of θa, shape (n, n).

    ``constants``: precomputed terms that do not depend on ``perm`` (``constant_terms``)."""
    cost = None
    for name, axis in spec.groups[group]:
        if name in spec.stats:
            continue
        term = (constants or {}).get((name, axis, group))
        term = _term(spec, perm, name, axis, group, params_a, params_b) if term is None else term
        cost = term if cost is None else cost + term
    return cost


def constant_terms(
    spec: PermutationSpec, params_a: Mapping[str, Tensor], params_b: Mapping[str, Tensor]
) -> dict[tuple[str, int, str], Tensor]:
    """The terms of every ``group_cost`` whose other axes carry no permutation (they never change)."""
    return {
        (name, axis, group): _term(spec, {}, name, axis, group, params_a, params_b)
        for group in spec.groups
        for name, axis in spec.groups[group]
        if name not in spec.stats and _is_constant(spec, name, axis)
    }


def cost_dependencies(spec: PermutationSpec, group: str) -> frozenset[str]:
    """The other groups whose permutation enters ``group_cost(group)``."""
    return frozenset(
        g
        for name, axis in spec.groups[group]
        if name not in spec.stats
        for i, e in enumerate(spec.axes[name])
        if i != axis
        for g in entry_groups(e)
    )
