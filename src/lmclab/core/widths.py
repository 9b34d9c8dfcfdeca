"""Two models of different widths: the narrower one embedded in the wider one's widths, unit for unit.

A group with ``n_b`` units in θb and ``n_a ≥ n_b`` in θa: the embedding ``ι(θb)`` keeps θb's units in the first
``n_b`` of ``n_a`` places and fills the others with empty units — zero rows of every layer that writes the group,
zero columns of every layer that reads it, zero gains, biases and running statistics — a model of θa's widths.
It computes θb's function wherever every operation on the group acts unit by unit or reads it linearly (an empty
unit is 0 after a linear write and a BatchNorm, ``f(0)`` after an elementwise ``f``, and whatever it holds meets
zero columns): the tracer proves which groups those are (:mod:`lmclab.trace.widths`). An element ``π`` of θa's
group then aligns ``ι(θb)``, and ``π ∘ ι`` is the rectangular counterpart of its kind (Theus et al. 2025,
Section 3): for a permutation group a *semi-permutation*, an injection of θb's units into θa's places (the
``n_a × n_b`` matrix with one 1 per column), and for an orthogonal group a map ``Q = O[:, :n_b]`` with orthonormal
columns (``QᵀQ = I``). The search over ``π`` is the rectangular one: an empty unit adds nothing to a weight
matching cost (its column of ``C`` is zero), so the assignment places θb's units as the rectangular assignment
does and the polar factor of ``[C_b, 0]`` restricted to its first ``n_b`` columns is the polar factor of ``C_b``.

>>> import torch
>>> from lmclab.core.spec import build_spec
>>> spec = build_spec({"w1": ("P", None), "b1": ("P",), "w2": (None, "P")})
>>> small = {"w1": torch.ones(2, 3), "b1": torch.ones(2), "w2": torch.ones(4, 2)}
>>> wide = widened(spec, small, {"P": 3}, {"P": 2})
>>> wide["w1"].shape, wide["w2"][:, 2].tolist()
(torch.Size([3, 3]), [0.0, 0.0, 0.0, 0.0])
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from lmclab.core.spec import Entry, Params, PermutationSpec, Segment, entry_groups, segments, with_metadata


def narrower_groups(sizes_a: Mapping[str, int], sizes_b: Mapping[str, int], what: str = "model_b") -> dict[str, int]:
    """The groups where θb (``what``) has fewer units than θa, with θb's count; one line naming the first group
    where it has more (the wider model is the reference: pass it as θa)."""
    if set(sizes_a) != set(sizes_b):
        raise ValueError(f"{what}: groups {sorted(set(sizes_a) ^ set(sizes_b))[:3]} are not in both models")
    for group, n in sizes_b.items():
        if n > sizes_a[group]:
            raise ValueError(
                f"{what}: group {group!r} has {n} units, more than the reference model's {sizes_a[group]}; "
                "the widest model is the reference (model_a, models[0]), the narrower ones are embedded in its widths"
            )
    return {g: n for g, n in sizes_b.items() if n != sizes_a[g]}


def check_free(narrower: Mapping[str, int], fixed: Mapping[str, str], what: str = "model_b") -> None:
    """One line naming the first group of ``narrower`` whose width the trace found fixed, and why (``fixed``:
    group → the node that reads its units otherwise than one by one or linearly)."""
    for group in narrower:
        if group in fixed:
            raise ValueError(f"{what}: group {group!r} differs in width, which changes the function: {fixed[group]}")


def plain_sizes(spec: PermutationSpec, params: Mapping[str, Tensor], what: str = "model_b") -> dict[str, int]:
    """Each group's units in ``params``, read off the axes it holds whole (a layer's rows that write it), else off
    a composite axis whose other segments' groups are known (GPT-2's packed ``c_attn``: Q, K, V side by side); one
    line naming ``what`` when two disagree or a group's width cannot be read."""
    sizes: dict[str, int] = {}
    for group, places in spec.groups.items():
        for name, axis in places:
            if isinstance(spec.axes[name][axis], str):
                n = params[name].shape[axis]
                if sizes.setdefault(group, n) != n:
                    where = f"axis {axis} of {name!r}"
                    raise ValueError(f"{what}: group {group!r} has {n} units on {where}, {sizes[group]} elsewhere")
    for group, places in spec.groups.items():
        for name, axis in places if group not in sizes else ():
            _solve(spec.axes[name][axis], params[name].shape[axis], sizes)
        if group not in sizes:
            raise ValueError(f"{what}: the width of group {group!r} cannot be read off its axes")
    return sizes


def _solve(entry: tuple[Segment, ...], length: int, sizes: dict[str, int]) -> None:
    """The one group of a composite axis of ``length`` entries whose width ``sizes`` lacks, from the others'."""
    unknown = {s.group for s in entry if s.group is not None and s.group not in sizes}
    if len(unknown) != 1:
        return
    (group,) = unknown
    known = sum(s.length if s.group is None else sizes[s.group] * s.block * s.copies for s in entry if s.group != group)
    per_unit = sum(s.block * s.copies for s in entry if s.group == group)
    if length > known and (length - known) % per_unit == 0:
        sizes[group] = (length - known) // per_unit


def widened(
    spec: PermutationSpec, params: Mapping[str, Tensor], sizes: Mapping[str, int], own: Mapping[str, int]
) -> Params:
    """``ι(θ)``: every group of ``params`` (``own[g]`` units) filled up to ``sizes[g]`` with empty units after its own
    (module docstring); ``spec`` is the wider model's, whose composite axes hold each group's units in blocks."""
    out: Params = {}
    for name, value in params.items():
        for axis, entry in enumerate(spec.axes[name]):
            if entry_groups(entry):
                value = _widened_axis(value, axis, entry, sizes, own, name)
        out[name] = value
    return with_metadata(out, params)


def _widened_axis(
    value: Tensor, axis: int, entry: Entry, sizes: Mapping[str, int], own: Mapping[str, int], name: str
) -> Tensor:
    """One axis of ``value`` widened: each segment's ``own × block`` stretch to ``sizes × block`` entries."""
    wide = (Segment(entry, sizes[entry]),) if isinstance(entry, str) else segments(entry, 0)
    parts, offset = [], 0
    for seg in wide:
        units = own[seg.group] if seg.group is not None else seg.length // (seg.block * seg.copies)
        length = units * seg.block * seg.copies
        part = value.narrow(axis, offset, min(length, value.shape[axis] - offset))
        offset += length
        if seg.group is not None and units != sizes[seg.group]:
            if seg.copies != 1:
                raise ValueError(f"group {seg.group!r}: copies of its units (grouped queries) cannot be widened")
            shape = list(part.shape)
            shape[axis] = (sizes[seg.group] - units) * seg.block
            part = torch.cat([part, part.new_zeros(shape)], axis)
        parts.append(part)
    if offset != value.shape[axis]:
        raise ValueError(f"axis {axis} of {name!r} has {value.shape[axis]} entries, its groups' widths say {offset}")
    return torch.cat(parts, axis) if len(parts) > 1 else parts[0]
