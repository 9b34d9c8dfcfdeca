"""The bookkeeping of :mod:`lmclab.trace`: tags on graph values, the union-find over channel groups,
and the tables of modules and functions that carry or merge a group."""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
import torchvision
from torch import nn

FIXED = -1  # the union-find root of every group that must not be permuted
POOL_MODULES = (nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d)  # windows over the last two axes
POOL_FUNCTIONS = {torch.nn.functional.max_pool2d, torch.nn.functional.avg_pool2d,
                  torch.nn.functional.adaptive_avg_pool2d, torch.nn.functional.adaptive_max_pool2d}
CARRY_MODULES = (nn.ReLU, nn.ReLU6, nn.GELU, nn.SiLU, nn.Sigmoid, nn.Tanh, nn.Hardswish, nn.Hardsigmoid,
                 nn.LeakyReLU, nn.ELU, nn.Dropout, nn.Identity, nn.Hardtanh, nn.Softplus, nn.Mish, *POOL_MODULES)
CARRY_FUNCTIONS = {torch.relu, torch.nn.functional.relu, torch.nn.functional.gelu, torch.nn.functional.silu,
                   torch.sigmoid, torch.tanh, torch.nn.functional.dropout, torch.nn.functional.relu6,
                   torch.nn.functional.hardswish, operator.neg, *POOL_FUNCTIONS,
                   torchvision.ops.stochastic_depth}  # drops whole samples (or the whole batch), never channels
MERGE_FUNCTIONS = {operator.add, torch.add, operator.mul, torch.mul, operator.iadd, operator.imul}


@dataclass(frozen=True)
class Seg:
    """``length`` consecutive entries of an axis permuted by union-find element ``gid`` in blocks of
    ``block`` (the tracer's form of :class:`lmclab.spec.Segment`)."""

    gid: int
    length: int
    block: int = 1


@dataclass(frozen=True)
class Tag:
    """Axis ``axis`` of a node's output is permuted segment by segment as ``segs`` say."""

    axis: int
    segs: tuple[Seg, ...]

    @staticmethod
    def single(gid: int, axis: int, length: int) -> Tag:
        return Tag(axis, (Seg(gid, length),))

    @property
    def gids(self) -> list[int]:
        return [s.gid for s in self.segs]

    @property
    def plain(self) -> bool:
        """One group on the whole axis, unit by unit."""
        return len(self.segs) == 1 and self.segs[0].block == 1

    def blocks_of(self, factor: int, axis: int) -> Tag:
        """The tag after the axis is flattened with the ``factor`` entries that follow each of its own."""
        return Tag(axis, tuple(Seg(s.gid, s.length * factor, s.block * factor) for s in self.segs))


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
            raise TraceError(f"trace_spec: one group is read by grouped convolutions in runs of {old} and of "
                             f"{factor} channels")
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
