"""The rules of :mod:`lmclab.trace` for nodes that change a tensor's shape: flatten and the reshapes
equal to it, concatenation and means. Mixed into :class:`lmclab.trace.graph.GraphTracer`.

- ``flatten`` of ``(N, C, H, W)`` from axis 1 maps channel ``c`` onto features ``c·HW … c·HW + HW − 1``:
  each segment of the channel axis becomes a segment in blocks ``HW`` times longer;
- ``cat`` along the permuted axis joins the segments of its operands (an unpermuted operand becomes a
  segment that is never permuted); along another axis its operands must be permuted alike;
- a mean over other axes keeps the permuted one.
"""

from __future__ import annotations

import math

from torch import fx

from lmclab.trace.groups import FIXED, Seg, Tag


class ShapeRules:
    """Needs the tracer's ``tag``, ``shape``, ``refuse``, ``unite`` and ``groups``."""

    def flatten(self, node: fx.Node, t_in: Tag | None, start: int, end: int) -> None:
        if t_in is None:
            self.tags[node] = None
            return
        shape_in = self.shape(node.args[0])
        start, end = start % len(shape_in), end % len(shape_in)
        if t_in.axis < start or t_in.axis > end:  # the permuted axis is not flattened
            self.tags[node] = Tag(t_in.axis if t_in.axis < start else t_in.axis - (end - start), t_in.segs)
        elif any(n != 1 for n in shape_in[start:t_in.axis]):
            self.refuse(node, "a flatten that interleaves the permuted axis with the axes before it")
        else:
            self.tags[node] = t_in.blocks_of(math.prod(shape_in[t_in.axis + 1:end + 1]), start)

    def reshape(self, node: fx.Node, t_in: Tag) -> None:
        shape_in, shape, axis = self.shape(node.args[0]), self.shape(node), t_in.axis
        if shape == shape_in:
            self.tags[node] = t_in
        elif len(shape) == axis + 1 and shape[:axis] == shape_in[:axis] and shape[axis] == math.prod(shape_in[axis:]):
            self.tags[node] = t_in.blocks_of(math.prod(shape_in[axis + 1:]), axis)  # = flatten(x, axis)
        else:
            self.refuse(node, f"a reshape {shape_in} -> {shape} it cannot follow")

    def cat(self, node: fx.Node) -> None:
        tensors = list(node.args[0])
        shape = self.shape(node)
        dim = (node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)) % len(shape)
        tags = [self.tag(a) for a in tensors]
        if any(t is not None and t.axis != dim for t in tags):
            if any(t is None for t in tags) or not all(self.unite(tags[0].segs, t.segs) and t.axis == tags[0].axis
                                                       for t in tags[1:]):
                return self.refuse(node, "a concatenation of tensors permuted on another axis, not alike")
            self.tags[node] = tags[0]
            return
        segs: list[Seg] = []
        for a, t in zip(tensors, tags):
            segs.extend(t.segs if t is not None else (Seg(self.groups.union(self.groups.new(), FIXED),
                                                          self.shape(a)[dim]),))
        self.tags[node] = Tag(dim, tuple(segs))

    def reduce(self, node: fx.Node, t_in: Tag) -> None:
        shape_in, shape = self.shape(node.args[0]), self.shape(node)
        dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        dims = [d % len(shape_in) for d in ((dims,) if isinstance(dims, int) else dims or ())]
        if not dims or t_in.axis in dims:
            return self.refuse(node, "a mean over the permuted axis")
        keep = len(shape) == len(shape_in)
        self.tags[node] = Tag(t_in.axis - (0 if keep else sum(d < t_in.axis for d in dims)), t_in.segs)
