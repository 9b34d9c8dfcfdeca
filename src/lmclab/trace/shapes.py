"""The rules of :mod:`lmclab.trace` for nodes that change a tensor's shape: flatten and the reshapes
equal to it, transposes, concatenation and means. Mixed into :class:`lmclab.trace.graph.GraphTracer`.

- ``flatten`` of ``(N, C, H, W)`` from axis 1 maps channel ``c`` onto features ``c·HW … c·HW + HW − 1``:
  each segment of the channel axis becomes a segment in blocks ``HW`` times longer; permuted axes
  outside the flattened ones move with it; unpermuted axes flattened before the permuted one repeat its
  layout (``(…, 2, 2, C)`` into ``4C``: four copies of the channels' segments side by side);
- ``transpose``/``permute`` move the permuted axes with their layouts;
- ``cat`` along a permuted axis joins the segments of its operands (an unpermuted operand becomes a
  segment that is never permuted); on every other axis its operands must be permuted alike;
- a mean or sum over whole axes is the same in any order of their entries: the axes it keeps keep their layouts;
- an index by ints and full slices (``x[:, 0]``, the class token) keeps the permuted axes it does not pick from.
"""

from __future__ import annotations

import math

import torch
from torch import fx

from lmclab.trace.groups import (
    CARRY_FUNCTIONS,
    FIXED,
    MERGE_FUNCTIONS,
    POOL_FUNCTIONS,
    Layout,
    Seg,
    Tag,
    Within,
    blocks_of,
)
from lmclab.trace.state import TraceState, dim_of

# the elementwise functions of one tensor and constants (a parameter's gain ``1.0 + w``, a cast)
ELEMENTWISE_FUNCTIONS = MERGE_FUNCTIONS | (CARRY_FUNCTIONS - POOL_FUNCTIONS)
ELEMENTWISE_METHODS = {"add", "sub", "mul", "div", "pow", "neg", "exp", "sqrt", "rsqrt", "sigmoid", "tanh"}
ELEMENTWISE_METHODS |= {"to", "float", "double", "half", "bfloat16", "type_as", "clone", "contiguous"}


def _axis_order(node: fx.Node, ndim: int) -> list[int]:
    """For ``transpose``/``swapaxes``/``permute``: output axis ``i`` is input axis ``order[i]``."""
    args = list(node.args[1:]) + list(node.kwargs.values())
    if getattr(node.target, "__name__", node.target) == "permute":
        dims = args[0] if len(args) == 1 and isinstance(args[0], (list, tuple)) else args
        return [d % ndim for d in dims]
    d0, d1 = (d % ndim for d in args[:2])
    order = list(range(ndim))
    order[d0], order[d1] = d1, d0
    return order


class ShapeRules(TraceState):
    """Reads and writes the tracer's state (:class:`~lmclab.trace.state.TraceState`); also calls the tracer's
    ``unite`` and ``record``, and the planes' ``halved`` and ``turned_halves`` (:mod:`lmclab.trace.planes`)."""

    def flatten(self, node: fx.Node, t_in: Tag | None, start: int, end: int) -> None:
        if t_in is None:
            self.tags[node] = None
            return
        shape_in, lays = self.shape(node.args[0]), t_in.layouts
        start, end = start % len(shape_in), end % len(shape_in)
        inside = [a for a in self.live(t_in) if start <= a <= end]
        if any(self.is_headed(s) for a in inside for s in lays[a]):
            heads = [a for a in t_in.permuted if start <= a <= end]  # a pinned head order still joins its features
            if inside == [start] and self.repeated_heads(node, lays, start, end):
                return
            if (joined := self.joined_heads(lays, heads, start, end)) is None:
                return self.refuse(node, "a flatten that does not join a head axis to the features of its heads")
            self.tags[node] = Tag.of(lays[:start] + (joined,) + lays[end + 1 :])
            return
        if len(inside) > 1:
            return self.refuse(node, "a flatten of two permuted axes into one")
        merged = None  # the axes before the permuted one repeat its layout (Swin's patch merging: 2 × 2 × C)
        if inside:
            before, after = math.prod(shape_in[start : inside[0]]), math.prod(shape_in[inside[0] + 1 : end + 1])
            merged = blocks_of(lays[inside[0]], after) * before
        self.tags[node] = Tag.of(lays[:start] + (merged,) + lays[end + 1 :])

    def reshape(self, node: fx.Node, t_in: Tag) -> None:
        """A reshape that keeps the permuted axes (reshaping only others), flattens one into the axes
        after it, splits one group's units into ``(heads, d)`` (:mod:`lmclab.trace.attention`) or into
        ``(parts, heads, d)`` (:mod:`lmclab.trace.packed`); anything else (a channel shuffle) is refused."""
        shape_in, shape = self.shape(node.args[0]), self.shape(node)
        n, head, tail = min(len(shape_in), len(shape)), 0, 0
        while head < n and shape_in[head] == shape[head]:
            head += 1
        while tail < n - head and shape_in[-1 - tail] == shape[-1 - tail]:
            tail += 1
        lays, new = t_in.layouts, len(shape) - head - tail
        one = len(shape_in) - head - tail == 1  # one axis becomes ``new`` axes
        if not any(head <= a < len(shape_in) - tail for a in self.live(t_in)):  # permuted axes untouched
            self.tags[node] = Tag.of(lays[:head] + (None,) * new + lays[len(lays) - tail :])
        elif new == 1:  # = flatten(x, head, -1 - tail)
            self.flatten(node, t_in, head, len(shape_in) - 1 - tail)
        elif not (
            one
            and (
                (new == 2 and self.split_heads(node, t_in, head, *shape[head : head + 2]))
                or (new == 2 and self.split_runs(node, t_in, head, *shape[head : head + 2]))
                or (new == 3 and self.split_packed(node, t_in, head, *shape[head : head + 3]))
            )
        ):
            self.refuse(node, f"a reshape {shape_in} -> {shape} it cannot follow")

    def move(self, node: fx.Node, t_in: Tag) -> None:
        """transpose, swapaxes, permute: each permuted axis takes its layout along."""
        self.tags[node] = Tag.of([t_in.at(a) for a in _axis_order(node, len(self.shape(node)))])

    def cat(self, node: fx.Node) -> None:
        tensors = list(node.args[0])
        shape = self.shape(node)
        dim = dim_of(node, 1, 0) % len(shape)
        tags = [self.tag(a) for a in tensors]
        out: list[Layout] = []
        for axis in range(len(shape)):
            lays = [t.at(axis) if t is not None else None for t in tags]
            present = [lay for lay in lays if lay is not None]
            if axis == dim or not present:
                out.append(self.joined(node, lays, dim) if axis == dim else None)
            elif any(
                lay is None and self.parameter(a) is None for a, lay in zip(tensors, lays, strict=True)
            ) or not all(self.unite(present[0], lay) for lay in present[1:]):
                return self.refuse(node, "a concatenation of tensors permuted on another axis, not alike")
            else:
                out.append(present[0])
        for a, t in zip(tensors, tags, strict=True):  # a class token: permuted as the tokens it joins
            if t is None and (param := self.parameter(a)) is not None:
                s, offset = self.shape(param), len(shape) - len(self.shape(param))
                self.record(str(param.target), [None if n == 1 else out[k + offset] for k, n in enumerate(s)])
        self.tags[node] = Tag.of(out)

    def parameter(self, arg: fx.Node) -> fx.Node | None:
        """The parameter or buffer of the model that ``arg`` is, or broadcasts (``expand``)."""
        while arg.op == "call_method" and arg.target == "expand" or arg.target is torch.ops.aten.expand.default:
            arg = arg.args[0]
        return arg if arg.op == "get_attr" and arg.target in self.state_keys else None

    def per_channel(self, arg: fx.Node) -> tuple[fx.Node, list[int | None]] | None:
        """The parameter or buffer ``arg`` is computed from alone — elementwise with constants (``1.0 + w``,
        a cast) or reshaped by adding or dropping axes of length 1 (``gamma.reshape(1, -1, 1, 1)``) — and
        for each of its axes the axis of ``arg`` holding it (None: length 1). Permuting the parameter then
        permutes ``arg`` alike along those axes. None for anything else."""
        if arg.op == "get_attr" and arg.target in self.state_keys:
            return arg, [None if n == 1 else k for k, n in enumerate(self.shape(arg) or ())]
        method, nodes = (arg.target if arg.op == "call_method" else None), arg.all_input_nodes
        source = arg.args[0] if method in ("to", "type_as") else nodes[0] if len(nodes) == 1 else None
        if not isinstance(source, fx.Node) or None in (self.shape(source), self.shape(arg)):
            return None
        if (found := self.per_channel(source)) is None:
            return None
        param, at = found
        if method in ("view", "reshape", "unsqueeze", "squeeze") or arg.target in (torch.reshape, torch.unsqueeze):
            kept_in, kept = ([k for k, n in enumerate(self.shape(x)) if n != 1] for x in (source, arg))
            if [self.shape(source)[k] for k in kept_in] != [self.shape(arg)[k] for k in kept]:
                return None
            return param, [None if k is None else kept[kept_in.index(k)] for k in at]
        elementwise = arg.target in ELEMENTWISE_FUNCTIONS or method in ELEMENTWISE_METHODS
        return (param, at) if elementwise and self.shape(arg) == self.shape(source) else None

    def joined(self, node: fx.Node, lays: list[Layout], dim: int) -> Layout:
        """The segments of concatenation ``node``'s axis: each operand's own, a pinned one for an unpermuted
        operand; features of one group's heads in pieces (a rotary ``rotate_half``): its heads move whole, unless
        the pieces are the halves of one tensor rebuilt as ``±x`` or ``±J x`` (:mod:`lmclab.trace.planes`)."""
        tensors = list(node.args[0])
        if all(lay is None for lay in lays):
            return None
        within = [lay[0] for lay in lays if lay is not None and isinstance(lay[0], Within)]
        if within and len({self.groups.find(s.gid) for s in within}) == 1:
            if not self.turned_halves(node, within[0]):
                self.fix(tuple(within))
            return (Within(within[0].gid, sum(self.shape(a)[dim] for a in tensors)),)
        return tuple(
            seg
            for a, lay in zip(tensors, lays, strict=True)
            for seg in (
                lay if lay is not None else (Seg(self.groups.union(self.groups.new(), FIXED), self.shape(a)[dim]),)
            )
        )

    def index(self, node: fx.Node, t_in: Tag) -> None:
        """``x[i, :, None, …]`` with ints, slices and ``None``: an int drops an axis, ``None`` adds one; an
        int or a partial slice on a permuted axis (one unit, or some) is refused."""
        items = node.args[1] if isinstance(node.args[1], tuple) else (node.args[1],)
        ndim = len(self.shape(node.args[0]))
        if sum(i is Ellipsis for i in items) > 1 or not all(
            i is None or isinstance(i, (int, slice)) or i is Ellipsis for i in items
        ):
            return self.refuse(node, "an index by tensors")
        rest = ndim - sum(i is not None and i is not Ellipsis for i in items)
        items = [j for i in items for j in ([slice(None)] * rest if i is Ellipsis else [i])]
        items += [slice(None)] * (ndim + sum(i is None for i in items) - len(items))
        out, axis, live = [], 0, self.live(t_in)
        for i in items:
            if i is None:
                out.append(None)
                continue
            lay = t_in.at(axis)
            if axis in live and i != slice(None) and not isinstance(lay[0], Within):
                return self.refuse(node, "an index that picks units of a permuted axis")
            if axis in live and i != slice(None):  # features of heads read by position: the heads move whole
                if not self.halved(node, lay[0]):  # (but the halves of rotate_half: lmclab.trace.planes)
                    self.fix(lay)
                if isinstance(i, slice):
                    out.append((Within(lay[0].gid, self.shape(node)[len(out)]),))
            elif isinstance(i, slice):
                out.append(lay if i == slice(None) else None)
            axis += 1
        self.tags[node] = Tag.of(out)

    def reduce(self, node: fx.Node, t_in: Tag) -> None:
        """A mean (or sum) over whole axes: the same for any order of their entries, so a permuted axis it
        reduces is no longer permuted (RMSNorm's mean of squares); the other axes keep their layouts."""
        shape_in, shape = self.shape(node.args[0]), self.shape(node)
        dims = dim_of(node, 1)
        dims = [d % len(shape_in) for d in ((dims,) if isinstance(dims, int) else dims or range(len(shape_in)))]
        keep = len(shape) == len(shape_in)
        self.tags[node] = Tag.of(
            [None if a in dims else lay for a, lay in enumerate(t_in.layouts) if keep or a not in dims]
        )
