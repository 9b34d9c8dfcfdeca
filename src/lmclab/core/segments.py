"""The axes of a :class:`~lmclab.core.spec.PermutationSpec`: which group acts on which stretch of an axis.

An axis entry is a group name (the whole axis, unit by unit), ``None`` (never permuted) or a tuple of
:class:`Segment` s, consecutive stretches of the axis each permuted by its own group in blocks of ``block``
entries (a flatten of a ``C × H × W`` map onto a Linear's features is one segment with ``block = H·W``; a
concatenation of channel groups is one segment per group).

A segment may hold ``copies`` copies of its group's units, in runs of ``run`` units: the stretch is ``(R,
copies, run, block)`` laid out in that order, unit ``r·run + j`` of copy ``c`` at entries ``((r·copies + c)·run +
j)·block + b``. Grouped-query attention reads a key/value head's features once per query head it serves: the
``H = K·n`` query heads' rows of W_Q (and the columns of W_O) are ``n`` copies of the ``K`` key/value heads'
``d`` features, in runs of one head (``copies = n``, ``run = d``); one element of the group acts on every copy
alike (:func:`unit_places`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import torch
from torch import Tensor


class Segment(NamedTuple):
    """``length`` consecutive entries of an axis, permuted by ``group`` in blocks of ``block``."""

    group: str | None
    length: int
    block: int = 1
    copies: int = 1  # the stretch holds the group's units this many times, interleaved in runs of ``run``
    run: int = 1


Entry = str | None | tuple[Segment, ...]
Axes = tuple[Entry, ...]


def segments(entry: Entry, size: int) -> tuple[Segment, ...]:
    """The composite form of any axis entry of an axis of ``size`` entries."""
    if entry is None or isinstance(entry, str):
        return (Segment(entry, size),)
    return tuple(entry)


def entry_groups(entry: Entry) -> list[str]:
    """The groups acting on an axis, each once, in order."""
    if entry is None or isinstance(entry, str):
        return [] if entry is None else [entry]
    return list(dict.fromkeys(s.group for s in entry if s.group is not None))


def group_slices(entry: Entry, group: str, size: int) -> list[tuple[int, int, int, int, int]]:
    """``(offset, length, block, copies, run)`` of every stretch of the axis that ``group`` permutes."""
    out, offset = [], 0
    for seg in segments(entry, size):
        if seg.group == group:
            out.append((offset, seg.length, seg.block, seg.copies, seg.run))
        offset += seg.length
    return out


def unit_places(length: int, block: int = 1, copies: int = 1, run: int = 1) -> Tensor:
    """``(units, copies, block)``: the entries of a stretch of ``length`` holding each unit's ``block`` entries
    in each copy (module docstring)."""
    units = length // (block * copies)
    u, c, b = torch.arange(units)[:, None, None], torch.arange(copies)[None, :, None], torch.arange(block)
    return (((u // run) * copies + c) * run + u % run) * block + b


def unit_rows(value: Tensor, axis: int, offset: int, length: int, block: int, copies: int = 1, run: int = 1) -> Tensor:
    """The stretch ``offset : offset + length`` of ``axis`` as a matrix with one row per unit
    (a unit's ``block`` entries in every copy and all other axes flattened into its row)."""
    moved = value.narrow(axis, offset, length).movedim(axis, 0)
    if copies == 1:
        return moved.reshape(length // block, -1)
    places = unit_places(length, block, copies, run).to(value.device)
    return moved.reshape(length, -1)[places.reshape(-1)].reshape(places.shape[0], -1)


def axis_index(entry: Entry, perm: Mapping[str, Tensor], size: int) -> Tensor:
    """The index along an axis that applies ``perm`` to it (``value.index_select(axis, ·)``)."""
    if isinstance(entry, str):
        return perm[entry]
    parts, offset = [], 0
    for seg in segments(entry, size):
        if seg.group is None:
            parts.append(torch.arange(offset, offset + seg.length))
        elif seg.copies == 1:
            p = perm[seg.group].cpu()
            parts.append(offset + (p[:, None] * seg.block + torch.arange(seg.block)).reshape(-1))
        else:  # each copy's units permuted alike
            places = unit_places(seg.length, seg.block, seg.copies, seg.run)
            index = torch.empty(seg.length, dtype=torch.long)
            index[places.reshape(-1)] = places[perm[seg.group].cpu()].reshape(-1)
            parts.append(offset + index)
        offset += seg.length
    return torch.cat(parts)
