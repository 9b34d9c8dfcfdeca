"""The cost matrices of weight matching's coordinate descent (:mod:`lmclab.search.weight_matching`).

For one group ``g`` with every other group fixed, ``⟨θa, π(θb)⟩`` is linear in ``P_g`` with cost
``C_g = Σ_{(w, axis) ∈ g} W^a_(axis) · (W^b permuted on its other axes)_(axis)ᵀ`` (Ainsworth et al.
2023; the paper's Section 3): one term per entry the group permutes.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping

import torch
from torch import Tensor

from lmclab.core.shards import ShardedWeights
from lmclab.core.spec import (
    PermutationSpec,
    act_on_axis,
    axis_index,
    entry_groups,
    entry_shape,
    group_slices,
    permute_entry,
    unit_rows,
)


def matching_objective(
    spec: PermutationSpec, perm: Mapping[str, Tensor], params_a: Mapping[str, Tensor], params_b: Mapping[str, Tensor]
) -> float:
    """``⟨θa, π(θb)⟩`` over the matched entries (running statistics excluded), one entry read at a time."""
    return sum(entry_inner(spec, perm, k, params_a, params_b) for k in spec.matched_names(params_b))


def entry_inner(
    spec: PermutationSpec,
    perm: Mapping[str, Tensor],
    name: str,
    params_a: Mapping[str, Tensor],
    params_b: Mapping[str, Tensor],
) -> float:
    """``⟨θa, π(θb)⟩`` over the entry ``name`` (float32 products), summed over slices along an axis no group acts
    on (:func:`entry_slices`): no permuted copy of a whole large tensor."""
    total = 0.0
    for part_a, part_b in entry_slices(spec, name, None, params_a, params_b):
        total += float(torch.dot(part_a.flatten().float(), permute_entry(spec, perm, name, part_b).flatten().float()))
    return total


def _permute_other_axes(
    spec: PermutationSpec, perm: Mapping[str, Tensor], name: str, value: Tensor, skip_axis: int
) -> Tensor:
    for axis, entry in enumerate(spec.axes[name]):
        if entry_groups(entry) and axis != skip_axis:
            value = act_on_axis(value, axis, entry, perm)
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
    permutes (a composite axis: one per segment, each unit's block in its row), summed over slices along an axis
    no group acts on (:func:`entry_slices`)."""
    term, length = None, entry_shape(params_a, name)[axis]
    for part_a, part_b in entry_slices(spec, name, axis, params_a, params_b):
        part_b = _permute_other_axes(spec, perm, name, part_b, axis)
        for where in group_slices(spec.axes[name][axis], group, length):
            part = unit_rows(part_a, axis, *where) @ unit_rows(part_b, axis, *where).T
            term = part if term is None else term + part
    return term


SLICE = 2**22  # entries per slice of a large tensor in a cost term (16 MiB in float32)


def entry_slices(
    spec: PermutationSpec, name: str, axis: int | None, params_a: Mapping[str, Tensor], params_b: Mapping[str, Tensor]
) -> Iterator[tuple[Tensor, Tensor]]:
    """The entry ``name`` of both models cut alike along the longest axis no group acts on (but ``axis``) into
    slices of about :data:`SLICE` entries — a token embedding along its vocabulary —, or whole when it is no
    larger or every axis is acted on: a term's copies (θb permuted, its rows) are a slice's, not the tensor's, and
    a checkpoint read lazily (:class:`lmclab.core.shards.ShardedWeights`) is read a slice at a time along its
    first axis."""
    shape = entry_shape(params_a, name)
    d = slice_axis(spec, name, axis, shape)
    if d is None:
        yield params_a[name], params_b[name]
        return
    step = max(1, SLICE * shape[d] // shape.numel())
    spans = [(start, min(step, shape[d] - start)) for start in range(0, shape[d], step)]
    if d == 0 and isinstance(params_a, ShardedWeights) and isinstance(params_b, ShardedWeights):
        for start, length in spans:
            yield params_a.rows(name, start, start + length), params_b.rows(name, start, start + length)
        return
    w_a, w_b = params_a[name], params_b[name]
    for start, length in spans:
        yield w_a.narrow(d, start, length), w_b.narrow(d, start, length)


def slice_axis(spec: PermutationSpec, name: str, axis: int | None, shape: torch.Size) -> int | None:
    """The axis :func:`entry_slices` cuts the entry along — the longest no group acts on (but ``axis``) —, or None
    when it is read whole (no larger than a slice, or every axis acted on)."""
    free = [d for d, e in enumerate(spec.axes[name]) if d != axis and not entry_groups(e)]
    return max(free, key=lambda k: shape[k]) if free and shape.numel() > SLICE else None


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


class TermCache:
    """The terms of every ``group_cost``, each kept with the index it was computed at on each of its
    other permuted axes; :meth:`cost` returns a group's cost at ``perm`` taking each term as

    * **kept** — every other axis's index unchanged: the same product (exact);
    * **updated** — the index changed on one other axis at ``k`` positions, ``k`` at most ``update_at``
      of its length: ``T += A_S · (B_new − B_old)_Sᵀ`` over those ``k`` slices only (the same term in exact
      arithmetic, at ``k / n`` of the product's cost — late sweeps move a few units);
    * **recomputed** — otherwise.

    ``counts`` tallies the three. ``update_at=0`` recomputes every changed term (the plain loop's products).
    ``keep_bytes`` bounds the terms kept (a term computed beyond it is used once and recomputed when next asked
    for): a model too large to hold the terms of every group — the MLP groups of a billion-parameter transformer
    hold gigabytes of them — is matched in bounded memory at the cost of its products."""

    def __init__(
        self,
        spec: PermutationSpec,
        params_a: Mapping[str, Tensor],
        params_b: Mapping[str, Tensor],
        *,
        update_at: float = 0.5,
        keep_bytes: float = math.inf,
    ) -> None:
        self.spec, self.params_a, self.params_b, self.update_at = spec, params_a, params_b, update_at
        self.keep_bytes, self.kept_bytes = keep_bytes, 0
        self.terms: dict[tuple[str, int, str], tuple[Tensor, dict[int, Tensor]]] = {}
        self.dots: dict[str, tuple[float, dict[int, Tensor]]] = {}
        self.counts = {"kept": 0, "updated": 0, "recomputed": 0}

    def _index(self, name: str, perm: Mapping[str, Tensor], skip: int | None = None) -> dict[int, Tensor]:
        """The index of every permuted axis of ``name`` but ``skip`` at ``perm`` (on the CPU)."""
        shape = entry_shape(self.params_b, name)
        return {
            d: axis_index(e, perm, shape[d]).cpu()
            for d, e in enumerate(self.spec.axes[name])
            if d != skip and entry_groups(e)
        }

    def objective(self, perm: Mapping[str, Tensor]) -> float:
        """``⟨θa, π(θb)⟩`` over the matched entries, the same float as ``matching_objective``: an entry's
        inner product is recomputed only when the index of one of its axes changed since the last call."""
        total = 0.0
        for name in self.spec.matched_names(self.params_b):
            index, kept = self._index(name, perm), self.dots.get(name)
            if kept is None or any(not torch.equal(kept[1][d], i) for d, i in index.items()):
                inner = entry_inner(self.spec, perm, name, self.params_a, self.params_b)
                kept = self.dots[name] = (inner, index)
            total += kept[0]
        return total

    def cost(self, group: str, perm: Mapping[str, Tensor]) -> Tensor:
        """``C[i, j]``, the gain of mapping unit ``j`` of θb onto unit ``i`` of θa, at ``perm`` (as ``group_cost``)."""
        cost = None
        for name, axis in self.spec.groups[group]:
            if name not in self.spec.stats:
                term = self.term(name, axis, group, perm)
                cost = term if cost is None else cost + term
        return cost

    def term(self, name: str, axis: int, group: str, perm: Mapping[str, Tensor]) -> Tensor:
        """One term of ``group``'s cost at ``perm`` (class docstring)."""
        key, shape = (name, axis, group), entry_shape(self.params_b, name)
        index = self._index(name, perm, skip=axis)
        kept = self.terms.get(key)
        moved = {d: (kept[1][d] != i).nonzero().flatten() for d, i in index.items()} if kept else {}
        moved = {d: at for d, at in moved.items() if len(at)}
        if kept is not None and not moved:
            self.counts["kept"] += 1
            return kept[0]
        if kept is not None and len(moved) == 1 and self._small(moved, shape):
            ((d, at),) = moved.items()
            term = kept[0] + self._change(name, axis, group, at, kept[1][d], index, d)
            self.counts["updated"] += 1
        else:
            term = _term(self.spec, perm, name, axis, group, self.params_a, self.params_b)
            self.counts["recomputed"] += 1
        self._keep(key, term, index)
        return term

    def _keep(self, key: tuple[str, int, str], term: Tensor, index: dict[int, Tensor]) -> None:
        """``term`` kept with its index in place of the key's last one, while the kept terms fit ``keep_bytes``."""
        old = self.terms.pop(key, None)
        self.kept_bytes -= old[0].nbytes if old is not None else 0
        if self.kept_bytes + term.nbytes <= self.keep_bytes:
            self.terms[key] = (term, index)
            self.kept_bytes += term.nbytes

    def _small(self, moved: Mapping[int, Tensor], shape: tuple[int, ...]) -> bool:
        return all(len(at) <= self.update_at * shape[d] for d, at in moved.items())

    def _change(
        self, name: str, axis: int, group: str, at: Tensor, old: Tensor, index: Mapping[int, Tensor], d: int
    ) -> Tensor:
        """``A_S · (B_new − B_old)_Sᵀ``: the term's change when axis ``d``'s index moves from ``old`` at the
        positions ``at`` (``index``: the new index of every other permuted axis)."""
        w_a, w_b = self.params_a[name], self.params_b[name]
        dev = w_b.device
        slice_a = w_a.index_select(d, at.to(dev))
        delta = w_b.index_select(d, index[d][at].to(dev)) - w_b.index_select(d, old[at].to(dev))
        for e, i in index.items():  # the other permuted axes, unmoved
            delta = delta if e == d else delta.index_select(e, i.to(dev))
        change = None
        for where in group_slices(self.spec.axes[name][axis], group, w_a.shape[axis]):
            part = unit_rows(slice_a, axis, *where) @ unit_rows(delta, axis, *where).T
            change = part if change is None else change + part
        return change
