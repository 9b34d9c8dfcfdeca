"""The rules of :mod:`lmclab.trace` for functional norms and for ops along spatial axes. Mixed into
:class:`lmclab.trace.graph.GraphTracer`.

- ``F.batch_norm(x, running_mean, running_var, weight, bias)`` (timm's ``BatchNormAct2d``): channel ``c``
  is normalised by its own statistics (over every other axis) and scaled by its own weight, so
  permuting the channels permutes the output alike when the four vectors are permuted with them; they
  take the layout of axis 1, as the module's parameters and buffers do;
- ``F.layer_norm(x, (last,), weight, bias)`` (torchvision's LayerNorm2d) and ``F.rms_norm(x, (last,), weight)``
  (``nn.RMSNorm`` as ``torch.export`` records it): as the modules, over the last axis;
- ``F.group_norm(x, G, weight, bias)`` and ``nn.GroupNorm``: the mean and variance are taken over each run
  of ``C/G`` consecutive channels, so a permutation that moves a channel into another run changes
  them; permuting whole runs keeps them. The group on axis 1 is coarsened to runs of ``C/G`` channels (as
  a grouped conv's input is); a segment that does not hold whole runs is refused;
- ``F.pad`` and ``torch.roll`` act along the axes they pad or roll, on every position of the others
  alike: they carry the layout when those axes are not permuted and are refused when they are (a roll
  without ``dims`` flattens every axis first: refused on any permuted tensor).
"""

from __future__ import annotations

import torch
from torch import fx

from lmclab.trace.groups import Layout, Seg, Tag
from lmclab.trace.state import TraceState

F = torch.nn.functional
# each function's tensor arguments that may be parameters or buffers of the model (per channel)
NORM_ARGS = {
    F.batch_norm: ("input", "running_mean", "running_var", "weight", "bias"),
    F.layer_norm: ("input", "normalized_shape", "weight", "bias"),
    F.rms_norm: ("input", "normalized_shape", "weight"),
    F.group_norm: ("input", "num_groups", "weight", "bias"),
}
FUNCTIONAL_RULES = {F.linear: "functional_linear", **dict.fromkeys(NORM_ARGS, "functional_norm")}
FUNCTIONAL_RULES |= {F.pad: "spatial", torch.roll: "spatial", "roll": "spatial"}  # "roll": the method


class FunctionalRules(TraceState):
    """Reads and writes the tracer's state (:class:`~lmclab.trace.state.TraceState`); also calls the tracer's
    ``record`` and ``grouped_output``."""

    def carry(self, node: fx.Node, t_in: Tag | None, pool: bool = False) -> None:
        """An elementwise or identity-like op (``pool``: a window over the last two axes): the input's layout (a
        cast's, ``x.type_as(y)`` or ``x.to(y)``, is ``x``'s: ``y`` gives only the dtype)."""
        if node.target in ("to", "type_as", torch.ops.aten.type_as.default) and isinstance(node.args[0], fx.Node):
            t_in = self.tag(node.args[0])
        shape_in = self.shape(node.args[0]) if node.args and isinstance(node.args[0], fx.Node) else None
        shape = self.shape(node)
        if t_in is None:
            self.tags[node] = None
        elif (
            shape is None
            or shape_in is None
            or len(shape) != len(shape_in)
            or any(shape[a] != shape_in[a] for a in self.live(t_in))
        ):
            self.refuse(node, "it changes a permuted axis")
        elif pool and any(a >= len(shape) - 2 for a in self.live(t_in)):
            self.refuse(node, "a pooling window over a permuted axis")
        else:  # an axis whose groups are all pinned may change its length: it is no longer tagged
            self.tags[node] = Tag.of([lay if shape[a] == shape_in[a] else None for a, lay in enumerate(t_in.layouts)])

    def functional_norm(self, node: fx.Node, t_in: Tag) -> None:
        """A functional norm: its per-channel vectors take the layout of the normalised channel axis."""
        names = NORM_ARGS[node.target]
        args = dict(zip(names, node.args, strict=False)) | node.kwargs  # args may be fewer
        if self.tag(args.get("input")) is not t_in:
            return self.refuse(node, "a norm whose statistics or scale are computed from a permuted tensor")
        ndim = len(self.shape(node))
        if node.target in (F.layer_norm, F.rms_norm):
            k = len(args["normalized_shape"])
            if k > 1 and any(a >= ndim - k for a in self.live(t_in)):
                return self.refuse(node, "a LayerNorm or RMSNorm over more than the permuted feature axis")
            layout = t_in.at(ndim - 1)
            if t_in.plain(ndim - 1):  # an activation point when the module's output is this norm's
                self.written(node, layout[0].gid, ("LayerNorm", "RMSNorm"), role="norm")
        elif node.target is F.group_norm:
            if (layout := self.norm_groups(t_in, args["num_groups"])) is None and t_in.at(1) is not None:
                return self.refuse(node, "a group norm over runs of channels that segments of the axis split")
        else:
            layout = t_in.at(1)
        for key in names[1:]:  # the per-channel tensors (normalized_shape, num_groups: ints)
            param = args.get(key)
            if isinstance(param, fx.Node):
                if param.op != "get_attr" or param.target not in self.state_keys:
                    return self.refuse(node, f"a norm whose {key} is not a parameter or buffer of the model")
                self.record(str(param.target), [layout])
        self.tags[node] = t_in

    def norm_groups(self, t_in: Tag, num_groups: int) -> Layout:
        """The channel axis's layout coarsened to whole runs of ``C/G`` channels (None: a segment splits a run)."""
        lay = t_in.at(1)
        if lay is None or num_groups == 1:  # one run: statistics over every channel, any permutation keeps them
            return lay
        size = sum(s.length for s in lay) // num_groups
        return self.grouped_output(Tag.of([None, lay]), size, size)

    def functional_linear(self, node: fx.Node, t_in: Tag | None) -> None:
        """``F.linear(x, weight, bias)`` (timm's ``Linear``, which the graph enters): as ``nn.Linear``, a new group
        on the last axis, the input's layout of it on the weight's axis 1, other permuted axes kept."""
        args = dict(zip(("input", "weight", "bias"), node.args, strict=False)) | node.kwargs
        params = [p for p in (args.get("weight"), args.get("bias")) if p is not None]
        owned = all(isinstance(p, fx.Node) and self.parameter(p) is p for p in params)
        if self.tag(args["input"]) is not t_in or not owned:
            return self.refuse(node, "a linear whose weight or bias is not a parameter of the model")
        g, shape = self.groups.new(), self.shape(node)
        out = (Seg(g, shape[-1]),)
        self.record(str(params[0].target), [out, t_in.at(-1) if t_in else None])
        if len(params) > 1:
            self.record(str(params[1].target), [out])
        self.written(node, g, ("Linear",))
        base = t_in.layouts[:-1] if t_in else (None,) * (len(shape) - 1)
        self.tags[node] = Tag.of(base + (out,))

    def spatial(self, node: fx.Node, t_in: Tag) -> None:
        """``F.pad`` (the last ``len(pad) // 2`` axes, from the last) and ``torch.roll`` (``dims``)."""
        ndim, args = len(self.shape(node)), list(node.args[1:])
        if node.target is F.pad:
            pad = args[0] if args else node.kwargs["pad"]
            axes = [ndim - 1 - i for i in range(len(pad) // 2) if pad[2 * i] or pad[2 * i + 1]]
        else:
            dims = args[1] if len(args) > 1 else node.kwargs.get("dims")
            axes = list(range(ndim)) if dims is None or dims == () else [d % ndim for d in _ints(dims)]
        if any(a in self.live(t_in) for a in axes) or any(self.tag(a) is not None for a in node.all_input_nodes[1:]):
            return self.refuse(node, f"a {getattr(node.target, '__name__', node.target)} along a permuted axis")
        self.carry(node, t_in)


def _ints(dims: int | tuple | list) -> list[int]:
    return [dims] if isinstance(dims, int) else list(dims)
