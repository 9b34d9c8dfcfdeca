"""The rules of :mod:`lmclab.trace` for operations that read a permuted tensor's shape but not its values, and
for a fixed permutation of channels (a channel shuffle). Mixed into :class:`lmclab.trace.graph.GraphTracer`.

- ``x.new_zeros(size)``, ``torch.zeros_like(x)`` and their kind (torchvision's Swin builds its shifted
  windows' mask so) make a tensor from ``x``'s shape, dtype and device alone: nothing in it is permuted;
- ``where(cond, x, y)`` (T5's masked position bias) picks entry by entry: as ``x + y`` (the operands' groups
  one on each axis), with ``cond`` an unpermuted operand: an axis it varies along is not permuted;
- ``adaptive_avg_pool1d(x, 1)`` (Hugging Face Swin's pooler, as ``torch.export`` records it) is the mean over
  the last axis (:mod:`lmclab.trace.export` rewrites it so);
- a channel shuffle (ShuffleNet V2: ``view (B, g·n, H, W) -> (B, g, n, H, W)``, ``transpose(1, 2)``, ``view``
  back) is a fixed permutation of the channels: channel ``i·n + j`` goes to ``j·g + i``. It commutes with a
  permutation of the channels only if that permutation moves every one of the ``g`` runs of ``n`` channels
  by one permutation of ``n``: so the first ``view`` is followed when its axis holds ``g`` segments of ``n``
  channels each, and makes their groups one (union-find; a finer one coarsened to the other's runs) on the
  new axis of ``n``, the axis of ``g`` unpermuted; the ``transpose`` moves it and the last ``view`` flattens
  it into blocks of ``g`` (``flatten`` above). ``chunk`` of such blocks into ``g`` pieces (the next unit's
  split, ``x.chunk(2, dim=1)``) refines their group into ``g`` groups of whole blocks side by side (every
  axis holding it, the finer groups coarsened into it included); when its units do not split evenly (a
  unit's block would straddle two pieces), the group is left unpermuted.

Why q, k and v packed head by head are refused (GPT-NeoX's ``view (B, T, H, 3d)`` then ``chunk(3, -1)``,
timm LeViT's ``view (B, N, H, dq + dk + dv)`` then ``split``, Bloom's ``view (B, T, H, 3, d)`` then
``x[..., 0, :]``): the projection's rows hold head 0's q, k, v features, then head 1's, …, so the features
of the queries are not one run of the axis; a headed group (:class:`lmclab.core.heads.Heads`) is one run
of ``H·d`` units, head after head, and a segment of a spec holds all of its group's units. The head order
could only be said by a group per head and part, with the order itself fixed (Bloom's ALiBi and LeViT's
attention biases fix it; GPT-NeoX's rotary heads do not). Such a split or index is refused in one line;
``partial=True`` leaves the projection's rows and the output projection's columns unpermuted (the
residual stream and the MLP groups stay permuted).
"""

from __future__ import annotations

import operator

import torch
from torch import fx

from lmclab.trace.calls import SPLITS
from lmclab.trace.groups import Layout, Seg, Tag, Within
from lmclab.trace.state import TraceState

aten = torch.ops.aten
FRESH = {
    *(aten.new_zeros.default, aten.new_ones.default, aten.new_empty.default, aten.new_full.default),
    *(aten.zeros_like.default, aten.ones_like.default, aten.empty_like.default, aten.full_like.default),
    *(torch.zeros_like, torch.ones_like, torch.empty_like, torch.full_like),
    *("new_zeros", "new_ones", "new_empty", "new_full"),  # the methods, as torch.fx records them
}
WHERE = {torch.where, aten.where.self, aten.where.ScalarOther, aten.where.ScalarSelf}
PACKED_PER_HEAD = "their rows interleave per head, which no headed group (one run of heads × features) can hold"
ROUTING_RULES = dict.fromkeys(FRESH, "fresh") | dict.fromkeys(WHERE, "where")


class RoutingRules(TraceState):
    """Reads and writes the tracer's state (:class:`~lmclab.trace.state.TraceState`) alone."""

    def fresh(self, node: fx.Node, t_in: Tag | None) -> None:
        """A tensor made from another's shape, dtype and device: not permuted."""
        self.tags[node] = None

    def where(self, node: fx.Node, t_in: Tag | None) -> None:
        """``where(cond, x, y)`` picks entry by entry: an addition of its three operands (``merge``), the condition
        an unpermuted operand, which fixes every permuted axis it varies along."""
        self.merge(node)

    def split_runs(self, node: fx.Node, t_in: Tag, axis: int, runs: int, n: int) -> bool:
        """``(…, g·n, …) -> (…, g, n, …)`` of an axis of ``g`` segments of ``n`` (a channel shuffle's first
        ``view``): their groups made one, on the axis of ``n`` (False: not ``g`` plain segments of ``n``)."""
        lay = t_in.at(axis)
        if len(lay) != runs or any(not isinstance(s, Seg) or s.length != n or self.is_headed(s) for s in lay):
            return False
        if not all(self.unite(lay[:1], (s,)) for s in lay[1:]):
            return False
        lays = t_in.layouts
        self.tags[node] = Tag.of(lays[:axis] + (None, (self.groups.resolve(lay[0]),)) + lays[axis + 1 :])
        return True

    def split_blocks(self, seg: Seg, parts: int) -> list[Layout] | None:
        """``parts`` equal pieces of one segment of whole blocks: its group refined into ``parts`` groups, one
        per piece; pinned when a block would straddle two pieces (None: a head order or headed group)."""
        root = self.groups.find(seg.gid)
        if self.is_headed(seg) or root in self.groups.heads:
            return None
        self.materialise(root)
        held = [s for lay in self.layouts() if lay is not None for s in lay if self.groups.find(s.gid) == root]
        if any(s.length % parts or (s.length // parts) % s.block for s in held):
            self.pin([root])
            return [(Seg(root, seg.length // parts, seg.block),)] * parts
        return [(Seg(g, seg.length // parts, seg.block),) for g in self.refine(root, parts)]

    def layouts(self) -> list[Layout]:
        tags = [*self.tags.values(), *(t for _, ts in self.packed.values() for t in ts)]
        tags += [t for ts in self.unbound.values() for t in ts]
        return [lay for t in tags if t is not None for lay in t.layouts] + [x for a in self.axes.values() for x in a]

    def materialise(self, root: int) -> None:
        """Every segment of a finer group coarsened into ``root`` written as ``root``'s own (its blocks): the
        finer group moves only with the coarse one, so the spec is the same, and a refinement of ``root``
        then splits those segments too."""

        def coarse(lay: Layout) -> Layout:
            if lay is None:
                return None
            resolved = [self.groups.resolve(s) if isinstance(s, Seg) else s for s in lay]
            return tuple(r if isinstance(r, Seg) and r.gid == root else s for s, r in zip(lay, resolved, strict=True))

        self.axes = {k: [coarse(lay) for lay in lays] for k, lays in self.axes.items()}
        self.tags = {n: t and Tag(tuple(map(coarse, t.layouts))) for n, t in self.tags.items()}
        self.unbound = {n: [t and Tag(tuple(map(coarse, t.layouts))) for t in ts] for n, ts in self.unbound.items()}

    def heads_reason(self, node: fx.Node) -> str:
        """Why a node touching heads or per-head features is refused: q, k, v packed head by head, or unknown."""
        t = self.tag(node.args[0]) if node.args else None
        dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)
        if node.target in SPLITS and t is not None and isinstance(dim, int):  # the methods' names are in SPLITS
            lay = t.at(dim % len(t.layouts))
            if lay is not None and any(isinstance(s, Within) for s in lay):
                return f"a split of each head's features into q, k, v packed head by head: {PACKED_PER_HEAD}"
        return "an operation over heads or per-head features it does not know"

    def packed_reason(self, node: fx.Node) -> str:
        """Why a node reading a packed tensor is refused: an index past the part axis (Bloom's ``(H, 3, d)``)."""
        items = node.args[1] if node.target is operator.getitem and len(node.args) > 1 else ()
        items = items if isinstance(items, tuple) else (items,)
        axis = self.packed[node.args[0]][0] if node.args and node.args[0] in self.packed else None
        if axis is not None and any(isinstance(i, int) for i in items[axis + 1 :]):
            return f"an index of q, k, v packed head by head, (heads, 3, d): {PACKED_PER_HEAD}"
        return "an operation on packed q/k/v it does not know"
