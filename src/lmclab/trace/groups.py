"""The bookkeeping of :mod:`lmclab.trace`: tags on graph values, the union-find over channel groups,
and the tables of modules and functions that carry or merge a group."""

from __future__ import annotations

import operator
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from lmclab.trace.pins import FIXED, PinLog

# windows over the last two axes
POOL_MODULES = (nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d)
POOL_FUNCTIONS = {
    torch.nn.functional.max_pool2d,
    torch.nn.functional.avg_pool2d,
    torch.nn.functional.adaptive_avg_pool2d,
    torch.nn.functional.adaptive_max_pool2d,
}
LAST_AXIS_NORMS = (nn.LayerNorm, nn.RMSNorm)  # normalise over the trailing ``normalized_shape`` axes
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
    torch.rsqrt,
    torch.sqrt,
    torch.exp,
    *POOL_FUNCTIONS,
}


def loaded_carry_functions() -> set:
    """Functions of a library a model may call that carry a group, once the model has loaded that library
    (this module never imports it: torchvision alone costs every ``lmclab`` command about 2 s): torchvision's
    stochastic depth drops whole samples (or the whole batch), never channels."""
    ops = sys.modules.get("torchvision.ops")
    return {ops.stochastic_depth} if ops is not None and hasattr(ops, "stochastic_depth") else set()


aten = torch.ops.aten
CARRY_FUNCTIONS |= {  # an exported graph's elementwise ops (lmclab.trace.export), casts and copies
    *(aten.gelu.default, aten.relu.default, aten.silu.default, aten.sigmoid.default, aten.tanh.default),
    *(aten.neg.default, aten.rsqrt.default, aten.sqrt.default, aten.erf.default, aten.exp.default),
    *(aten.pow.Tensor_Scalar, aten.mul.Scalar, aten.add.Scalar, aten.div.Scalar, aten.sub.Scalar),
    *(aten.dropout.default, aten.clone.default, aten.alias.default, aten.detach.default, aten.contiguous.default),
    *(aten.to.dtype, aten.to.dtype_layout, aten.to.device, aten._to_copy.default, aten.type_as.default),
    *(aten.hardtanh.default, aten.hardswish.default, aten.hardsigmoid.default, aten.relu6.default),
}
MERGE_FUNCTIONS = {
    operator.add,
    torch.add,
    operator.mul,
    torch.mul,
    operator.iadd,
    operator.imul,
    operator.sub,
    torch.sub,
    operator.truediv,
    torch.div,
}
SOFTMAX_FUNCTIONS = {torch.softmax, torch.nn.functional.softmax}
MATMUL_FUNCTIONS = {operator.matmul, torch.matmul}


@dataclass(frozen=True)
class Seg:
    """``length`` consecutive entries of an axis permuted by union-find element ``gid`` in blocks of ``block`` (the
    tracer's :class:`lmclab.core.spec.Segment`; ``copies``, ``run`` once resolved, :attr:`Groups.copies`)."""

    gid: int
    length: int
    block: int = 1
    copies: int = 1
    run: int = 1


@dataclass(frozen=True)
class Within:
    """An axis of the ``length`` features of each head of the headed group ``gid`` (a ``(…, H, d)`` reshape
    of its units): the features of head ``h`` are permuted by ``τ_h``, so the permutation of this axis
    depends on the position along the tensor's head axis (the one segment ``Seg(tie, H)`` of ``gid``'s tie)."""

    gid: int
    length: int
    block: int = 1


Layout = tuple[Seg | Within, ...] | None  # one axis: segments of union-find elements, or never permuted


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


class Groups(PinLog):
    """Union-find over group ids; ``FIXED`` absorbs every group that must stay unpermuted.

    A group may be *coarsened* (a grouped convolution reads it): its units are then permuted only in
    whole runs of ``factor`` consecutive units, by a coarse group of its own (``coarse``)."""

    def __init__(self) -> None:
        super().__init__()
        self.parent: dict[int, int] = {FIXED: FIXED}
        self.coarse: dict[int, tuple[int, int]] = {}  # root -> (coarse gid, factor)
        self.heads: dict[int, tuple[int, int]] = {}  # root of a headed group -> (head count, its tie)
        self.ties: set[int] = set()  # elements that are head orders σ (a head axis), never spec groups
        self.head_sizes: dict[int, int] = {}  # root of a headed group -> features per head
        self.rigid: set[int] = set()  # roots of headed groups whose heads move whole (features in place)
        self.copies: dict[int, tuple[int, int, int]] = {}  # root -> (base, copies, run): base's units, per query head
        self.partial = False  # set by the tracer: pin what cannot be followed instead of refusing

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
            return self.refused(
                root, f"one group is read by grouped convolutions in runs of {old} and of {factor} channels"
            )
        return coarse

    def refused(self, gid: int, reason: str) -> int:
        """A group the tracer cannot follow: one-line :class:`TraceError`, or with :attr:`partial` pinned for
        ``reason`` (its coarse group and head order with it); FIXED."""
        if not self.partial:
            raise TraceError(f"trace_spec: {reason}")
        cause = self.cause
        self.cause = cause and (*cause[:2], reason)
        self.union(gid, FIXED)
        self.cause = cause
        return FIXED

    def headed(self, gid: int, count: int, size: int) -> int:
        """Mark ``gid``'s group as ``count`` heads of ``size``; its tie (a new :attr:`ties` element the first time)."""
        root = self.find(gid)
        if root == FIXED:
            return FIXED
        self.head_sizes.setdefault(root, size)
        if root not in self.heads:
            tie = self.new()
            self.ties.add(tie)
            self.heads[root] = (count, tie)
        if self.heads[root][0] != count:
            return self.refused(root, f"one group is split into {self.heads[root][0]} and into {count} heads")
        return self.find(self.heads[root][1])

    def make_rigid(self, gid: int) -> None:
        """The heads of ``gid``'s group move whole, each keeping its features in place (a rotary embedding or a
        slice reads them by position): the group is coarsened to runs of one head, and the coarse group,
        one unit per head, is headed by the same tie (its σ is the heads' order)."""
        root = self.find(gid)
        if root == FIXED or root in self.rigid:
            return
        count, tie = self.heads[root]
        coarse = self.coarsen(root, self.head_sizes[root])
        self.rigid.add(root)
        self.heads.setdefault(self.find(coarse), (count, tie))

    def tie_of(self, gid: int) -> int | None:
        """The head order of ``gid``'s group (None: not headed)."""
        found = self.heads.get(self.find(gid))
        return None if found is None else self.find(found[1])

    def joinable(self, a: int, b: int) -> bool:
        """Two elements may be one: not a head order and a group, nor groups of different head counts
        (a pinned element joins anything: it pins the other)."""
        ra, rb = self.find(a), self.find(b)
        if FIXED in (ra, rb) or ra == rb:
            return True
        counts = [self.heads[r][0] for r in (ra, rb) if r in self.heads]
        return (ra in self.ties) == (rb in self.ties) and len(set(counts)) <= 1

    def pin_ties(self) -> None:
        """A pinned head order pins every group it orders (their σ is the identity, which no
        :class:`~lmclab.core.heads.Heads` can say), and a pinned headed group pins its order (in union)."""
        while pinned := [(r, tie) for r, (_, tie) in self.heads.items() if self.find(tie) == FIXED]:
            for root, tie in pinned:
                self.cause = self.first_causes().get(self.stream(tie))  # pinned for its heads' order
                self.union(root, FIXED)

    def union(self, a: int, b: int) -> int:
        self.logged(a, b, self.find)
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return ra
        root, child = (ra, rb) if ra == FIXED or (rb != FIXED and ra < rb) else (rb, ra)
        self.parent[child] = root
        if child in self.head_sizes:
            self.head_sizes.setdefault(root, self.head_sizes.pop(child))
        if child in self.rigid:
            self.rigid.add(root)
        if child in self.ties and root != FIXED:
            self.ties.add(root)
        if (headed := self.heads.pop(child, None)) is not None:
            if root == FIXED:
                self.union(headed[1], FIXED)
            elif root in self.heads:  # one group: one head count (joinable), one head order
                self.union(self.heads[root][1], headed[1])
            else:
                self.heads[root] = headed
        copied = self.copies.pop(child, None)  # queries pinned pin their keys; two copies of one base
        if copied and (root == FIXED or self.copies.setdefault(root, copied) != copied):
            self.union(copied[0], FIXED if root == FIXED else self.copies[root][0])
        moved = self.coarse.pop(child, None)
        if root == FIXED and moved:
            self.union(moved[0], FIXED)
        elif moved:  # both runs must agree: the root is coarsened alike and the coarse groups are one
            self.union(self.coarsen(root, moved[1]), moved[0])
        return self.find(root)

    def resolve(self, seg: Seg | Within) -> Seg:
        """``seg`` resolved: to the base group, in copies; to the coarse group, in blocks ``factor`` times longer."""
        root, block, copies, run = self.find(seg.gid), seg.block, 1, 1
        if root in self.copies:
            base, copies, run = self.copies[root]
            root = self.find(base)
        while root in self.coarse:
            coarse, factor = self.coarse[root]
            block, run, root = block * factor, max(run // factor, 1), self.find(coarse)
        return Seg(root, seg.length, block, copies, run)
