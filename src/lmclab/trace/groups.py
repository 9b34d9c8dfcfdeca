"""The bookkeeping of :mod:`lmclab.trace`: tags on graph values, the union-find over channel groups,
and the tables of modules and functions that carry or merge a group."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torchvision
from torch import nn

FIXED = -1  # the union-find root of every group that must not be permuted
# windows over the last two axes
POOL_MODULES = (nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d)
POOL_FUNCTIONS = {
    torch.nn.functional.max_pool2d,
    torch.nn.functional.avg_pool2d,
    torch.nn.functional.adaptive_avg_pool2d,
    torch.nn.functional.adaptive_max_pool2d,
}
CARRY_MODULES = (
    nn.ReLU,
    nn.ReLU6,
    nn.GELU,
    nn.SiLU,
    nn.Sigmoid,
    nn.Tanh,
    nn.Hardswish,
    nn.Hardsigmoid,
    nn.LeakyReLU,
    nn.ELU,
    nn.Dropout,
    nn.Identity,
    nn.Hardtanh,
    nn.Softplus,
    nn.Mish,
    *POOL_MODULES,
)
CARRY_FUNCTIONS = {
    torch.relu,
    torch.nn.functional.relu,
    torch.nn.functional.gelu,
    torch.nn.functional.silu,
    torch.sigmoid,
    torch.tanh,
    torch.nn.functional.dropout,
    torch.nn.functional.relu6,
    torch.nn.functional.hardswish,
    operator.neg,
    *POOL_FUNCTIONS,
    torchvision.ops.stochastic_depth,
}  # drops whole samples (or the whole batch), never channels
MERGE_FUNCTIONS = {operator.add, torch.add, operator.mul, torch.mul, operator.iadd, operator.imul}


@dataclass(frozen=True)
class Seg:
    """``length`` consecutive entries of an axis permuted by union-find element ``gid`` in blocks of
    ``block`` (the tracer's form of :class:`lmclab.core.spec.Segment`)."""

    gid: int
    length: int
    block: int = 1


Layout = tuple[Seg, ...] | None  # one axis: segments of union-find elements, or never permuted


@dataclass(frozen=True)
class Tag:
    """Per axis of a node's output, the segments permuting it (None: not permuted). Several axes may be
    permuted at once, each by its own groups (a Mixer's ``(batch, channels, token-hidden units)``)."""

    layouts: tuple[Layout, ...]

    @staticmethod
    def of(layouts: Sequence[Layout]) -> Tag | None:
        """The tag of ``layouts``; None when no axis is permuted."""
        return Tag(tuple(layouts)) if any(lay is not None for lay in layouts) else None

    @property
    def permuted(self) -> list[int]:
        """The axes that are permuted."""
        return [a for a, lay in enumerate(self.layouts) if lay is not None]

    @property
    def gids(self) -> list[int]:
        return [s.gid for lay in self.layouts if lay is not None for s in lay]

    def at(self, axis: int) -> Layout:
        return self.layouts[axis]

    def plain(self, axis: int) -> bool:
        """One group on the whole of ``axis``, unit by unit."""
        lay = self.layouts[axis]
        return lay is not None and len(lay) == 1 and lay[0].block == 1


def blocks_of(layout: Layout, factor: int) -> Layout:
    """A layout after its axis is flattened with the ``factor`` entries that follow each of its own."""
    return None if layout is None else tuple(Seg(s.gid, s.length * factor, s.block * factor) for s in layout)


class TraceError(ValueError):
    """A node the tracer cannot prove permutation-equivariant."""


class Groups:
    """Union-find over group ids; ``FIXED`` absorbs every group that must stay unpermuted.

    A group may be *coarsened* (a grouped convolution reads it): its units are then permuted only in
    whole runs of ``factor`` consecutive units, by a coarse group of its own (``coarse``)."""

    def __init__(self) -> None:
        self.parent: dict[int, int] = {FIXED: FIXED}
        self.coarse: dict[int, tuple[int, int]] = {}  # root -> (coarse gid, factor)

    def new(self) -> int:
        gid = len(self.parent) - 1
        self.parent[gid] = gid
        return gid

    def find(self, gid: int) -> int:
        while self.parent[gid] != gid:
            self.parent[gid] = self.parent[self.parent[gid]]
            gid = self.parent[gid]
        return gid

    def coarsen(self, gid: int, factor: int) -> int:
        """The coarse group permuting ``gid``'s units in runs of ``factor`` (a pinned group stays pinned)."""
        root = self.find(gid)
        if root == FIXED:
            return FIXED
        if root not in self.coarse:
            self.coarse[root] = (self.new(), factor)
        coarse, old = self.coarse[root]
        if old != factor:
            raise TraceError(
                f"trace_spec: one group is read by grouped convolutions in runs of {old} and of {factor} channels"
            )
        return coarse

    def union(self, a: int, b: int) -> int:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return ra
        root, child = (ra, rb) if ra == FIXED or (rb != FIXED and ra < rb) else (rb, ra)
        self.parent[child] = root
        moved = self.coarse.pop(child, None)
        if root == FIXED and moved:
            self.union(moved[0], FIXED)
        elif moved:  # both runs must agree: the root is coarsened alike and the coarse groups are one
            self.union(self.coarsen(root, moved[1]), moved[0])
        return self.find(root)

    def resolve(self, seg: Seg) -> Seg:
        """``seg`` with coarsening applied: the coarse group, in blocks ``factor`` times longer."""
        root = self.find(seg.gid)
        while root in self.coarse:
            coarse, factor = self.coarse[root]
            seg, root = Seg(coarse, seg.length, seg.block * factor), self.find(coarse)
        return Seg(root, seg.length, seg.block)
