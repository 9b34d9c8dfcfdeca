"""The rules of :mod:`lmclab.trace` for the layers that own parameters: ``Linear`` and ``Conv2d`` (a new group
on their output, the input's layout on their weight's axis 1; a grouped conv ties its input's conv groups
to its output's) and ``BatchNorm``/``GroupNorm``/``LayerNorm``/``RMSNorm`` (their parameters and statistics take the
layout of the normalised axis). Mixed into :class:`lmclab.trace.graph.GraphTracer`."""

from __future__ import annotations

from torch import fx, nn

from lmclab.trace.groups import FIXED, LAST_AXIS_NORMS, Seg, Tag
from lmclab.trace.state import TraceState


class LayerRules(TraceState):
    """Reads and writes the tracer's state (:class:`~lmclab.trace.state.TraceState`); also calls the tracer's
    ``record``."""

    def layer(self, node: fx.Node, name: str, module: nn.Module, t_in: Tag | None, axis: int, spatial: int) -> None:
        """Linear (``axis`` last) or ungrouped conv (``axis`` 1): a new group on the output's ``axis``, the
        input's layout of it on the weight's axis 1. The input's other permuted axes pass through: a Linear
        maps every position of them alike (a Mixer's token MLP keeps the channels' permutation)."""
        g, shape = self.groups.new(), self.shape(node)
        self.write(g, "layer", name, axis, len(shape))
        self.record(f"{name}.weight", [(Seg(g, shape[axis]),), t_in.at(axis) if t_in else None] + [None] * spatial)
        if getattr(module, "bias", None) is not None:
            self.record(f"{name}.bias", [(Seg(g, shape[axis]),)])
        base = t_in.layouts if t_in and not spatial else (None,) * len(shape)  # a conv's spatial axes: none
        self.tags[node] = Tag.of(base[:axis] + ((Seg(g, shape[axis]),),) + base[axis + 1 :])

    def conv(self, node: fx.Node, name: str, module: nn.Conv2d, t_in: Tag | None) -> None:
        if module.groups == 1:
            return self.layer(node, name, module, t_in, 1, spatial=2)
        c_in, c_out = module.in_channels // module.groups, module.out_channels // module.groups
        if t_in is None or t_in.at(1) is None:  # the conv's groups stay in place: a new group, pinned
            layout: tuple[Seg, ...] = (Seg(self.groups.union(self.groups.new(), FIXED), module.out_channels, c_out),)
        elif (layout := self.grouped_output(t_in, c_in, c_out)) is None:
            return self.refuse(
                node,
                f"a grouped convolution ({module.groups} groups of {c_in} channels) reading "
                "segments that do not hold whole groups",
            )
        self.record(f"{name}.weight", [layout, None, None, None])
        if module.bias is not None:
            self.record(f"{name}.bias", [layout])
        self.tags[node] = Tag.of((None, layout, None, None))

    def grouped_output(self, t_in: Tag, c_in: int, c_out: int) -> tuple[Seg, ...] | None:
        """A grouped conv (depthwise: ``c_in = 1``) maps its input's conv groups onto its output's: permuting
        whole groups of ``c_in`` input channels permutes the groups of ``c_out`` outputs alike (no permutation
        inside a group is a symmetry of the kernel's shared input axis). Each input segment is coarsened to
        runs of whole groups; None when a segment does not hold whole groups."""
        out = []
        for seg in map(self.groups.resolve, t_in.at(1)):
            if seg.length % c_in:
                return None
            if seg.block % c_in:  # runs shorter than a group: permute whole groups only
                if c_in % seg.block:
                    return None
                seg = self.groups.resolve(Seg(self.groups.coarsen(seg.gid, c_in // seg.block), seg.length, c_in))
            out.append(Seg(seg.gid, seg.length // c_in * c_out, seg.block // c_in * c_out))
        return tuple(out)

    def norm(self, node: fx.Node, name: str, module: nn.Module, t_in: Tag | None) -> None:
        """BatchNorm (channels on axis 1, statistics over all other axes), GroupNorm (axis 1 in whole runs of
        ``C/G`` channels: :mod:`lmclab.trace.functional`) or LayerNorm or RMSNorm over the last axis: its
        parameters and statistics take the layout of that axis; other permuted axes pass through."""
        shape = self.shape(node)
        axis = len(shape) - 1 if isinstance(module, LAST_AXIS_NORMS) else 1
        if (
            isinstance(module, LAST_AXIS_NORMS)
            and t_in is not None
            and len(module.normalized_shape) > 1
            and any(a >= len(shape) - len(module.normalized_shape) for a in self.live(t_in))
        ):
            return self.refuse(node, "a LayerNorm or RMSNorm over more than the permuted feature axis")
        if t_in is not None:
            layout = t_in.at(axis)
            if isinstance(module, nn.GroupNorm) and layout is not None:  # whole runs of C/G channels
                if (layout := self.norm_groups(t_in, module.num_groups)) is None:
                    return self.refuse(node, "a group norm over runs of channels that segments of the axis split")
            elif t_in.plain(axis):  # the axis holds exactly the units of one group: an activation point
                self.write(t_in.at(axis)[0].gid, "norm", name, axis, len(shape))
            for key, _ in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]:
                self.record(f"{name}.{key}", [] if key == "num_batches_tracked" else [layout])
        self.tags[node] = t_in
