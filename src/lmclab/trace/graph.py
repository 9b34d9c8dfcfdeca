"""The pass of :mod:`lmclab.trace` over a ``torch.fx`` graph: one rule per kind of node."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import fx, nn

from lmclab.spec import PermutationSpec, stats_of
from lmclab.trace.groups import (CARRY_FUNCTIONS, CARRY_MODULES, FIXED, MERGE_FUNCTIONS, Groups, Tag,
                                 TraceError)


def _where(node: fx.Node) -> str:
    """The module path a node belongs to (``(top level)`` outside any submodule)."""
    if node.op == "call_module":
        return str(node.target)
    stack = node.meta.get("nn_module_stack") or {}
    return next(reversed(stack.values()), ("(top level)",))[0] if stack else "(top level)"


def _op_name(node: fx.Node, model: nn.Module) -> str:
    if node.op == "call_module":
        return type(model.get_submodule(str(node.target))).__name__
    return getattr(node.target, "__name__", str(node.target))


class GraphTracer:
    """One pass over the graph in topological order, tagging each node's output."""

    def __init__(self, gm: fx.GraphModule, partial: bool) -> None:
        self.gm, self.partial, self.groups = gm, partial, Groups()
        self.tags: dict[fx.Node, Tag | None] = {}
        self.axes: dict[str, list[int | None]] = {}
        self.writers: dict[int, list[tuple[str, str]]] = {}  # group -> (norm | layer, module) writing it
        self.names: dict[int, str] = {}  # union-find root -> P_k, filled by result()

    # ---- helpers ----------------------------------------------------------------------------
    def tag(self, arg: object) -> Tag | None:
        return self.tags.get(arg) if isinstance(arg, fx.Node) else None

    def shape(self, node: fx.Node) -> tuple[int, ...] | None:
        meta = node.meta.get("tensor_meta")
        return tuple(meta.shape) if meta is not None and hasattr(meta, "shape") else None

    def tagged_inputs(self, node: fx.Node) -> list[Tag]:
        return [t for a in node.all_input_nodes if (t := self.tag(a)) is not None]

    def refuse(self, node: fx.Node, reason: str) -> None:
        if not self.partial:
            raise TraceError(f"trace_spec: node {node.name!r}: {_op_name(node, self.gm)} in {_where(node)} "
                             f"cannot be proved permutation-equivariant ({reason}); pass partial=True to leave "
                             "its channels unpermuted")
        for t in self.tagged_inputs(node):
            self.groups.union(t.group, FIXED)
        self.tags[node] = None

    def record(self, name: str, groups: Sequence[int | None]) -> None:
        """Axes of a parameter; a module used twice must see the same groups (they are merged)."""
        if name in self.axes:
            for a, b in zip(self.axes[name], groups):
                if (a is None) != (b is None):
                    raise TraceError(f"trace_spec: {name!r} is used on permuted and unpermuted inputs")
                if a is not None:
                    self.groups.union(a, b)
            return
        self.axes[name] = list(groups)

    # ---- the pass ----------------------------------------------------------------------------
    def run(self) -> None:
        for node in self.gm.graph.nodes:
            if node.op in ("placeholder", "get_attr"):
                self.tags[node] = None
            elif node.op == "output":
                for t in self.tagged_inputs(node):  # outputs are never permuted
                    self.groups.union(t.group, FIXED)
            elif node.op == "call_module":
                self.module(node, self.gm.get_submodule(str(node.target)))
            else:
                self.function(node)

    def module(self, node: fx.Node, module: nn.Module) -> None:
        name, x = str(node.target), node.args[0] if node.args else None
        t_in, shape = self.tag(x), self.shape(node)
        if isinstance(module, nn.Linear):
            if t_in is not None and t_in.axis != len(self.shape(x)) - 1:
                return self.refuse(node, "a Linear across a permuted axis that is not its feature axis")
            self.layer(node, name, module, t_in, len(shape) - 1, spatial=0)
        elif isinstance(module, nn.Conv2d):
            if t_in is not None and t_in.axis != 1:
                return self.refuse(node, "a convolution whose channel axis is not the permuted one")
            self.conv(node, name, module, t_in)
        elif isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d, nn.LayerNorm)):
            self.norm(node, name, module, t_in)
        elif isinstance(module, CARRY_MODULES):
            self.carry(node, t_in)
        elif isinstance(module, nn.Flatten):
            self.flatten(node, t_in, module.start_dim, module.end_dim)
        elif self.tagged_inputs(node):
            self.refuse(node, "an operation the tracer does not know")
        else:
            self.tags[node] = None

    def layer(self, node: fx.Node, name: str, module: nn.Module, t_in: Tag | None, axis: int, spatial: int) -> None:
        """Linear or ungrouped conv: a new group on the output, the input's on the weight's axis 1."""
        g = self.groups.new()
        self.writers.setdefault(g, []).append(("layer", name))
        self.record(f"{name}.weight", [g, t_in.group if t_in else None] + [None] * spatial)
        if getattr(module, "bias", None) is not None:
            self.record(f"{name}.bias", [g])
        self.tags[node] = Tag(g, axis)

    def conv(self, node: fx.Node, name: str, module: nn.Conv2d, t_in: Tag | None) -> None:
        if module.groups == 1:
            return self.layer(node, name, module, t_in, 1, spatial=2)
        if not module.groups == module.in_channels == module.out_channels:
            return self.refuse(node, f"a grouped convolution ({module.groups} groups of "
                                     f"{module.in_channels // module.groups} channels)")
        g = t_in.group if t_in else self.groups.union(self.groups.new(), FIXED)  # depthwise: ties out to in
        self.record(f"{name}.weight", [g, None, None, None])
        if module.bias is not None:
            self.record(f"{name}.bias", [g])
        self.tags[node] = Tag(g, 1) if self.groups.find(g) != FIXED else None

    def norm(self, node: fx.Node, name: str, module: nn.Module, t_in: Tag | None) -> None:
        shape = self.shape(node)
        if isinstance(module, nn.LayerNorm) and t_in is not None and (
                tuple(module.normalized_shape) != (shape[-1],) or t_in.axis != len(shape) - 1):
            return self.refuse(node, "a LayerNorm over more than the permuted feature axis")
        if t_in is not None:
            self.writers.setdefault(t_in.group, []).append(("norm", name))
            for key, _ in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]:
                self.record(f"{name}.{key}", [] if key == "num_batches_tracked" else [t_in.group])
        self.tags[node] = t_in

    def carry(self, node: fx.Node, t_in: Tag | None) -> None:
        shape_in = self.shape(node.args[0]) if node.args and isinstance(node.args[0], fx.Node) else None
        shape = self.shape(node)
        if t_in is not None and (shape is None or shape_in is None or len(shape) != len(shape_in)
                                 or shape[t_in.axis] != shape_in[t_in.axis]):
            return self.refuse(node, "it changes the permuted axis")
        self.tags[node] = t_in

    def flatten(self, node: fx.Node, t_in: Tag | None, start: int, end: int) -> None:
        if t_in is None:
            self.tags[node] = None
            return
        shape_in = self.shape(node.args[0])
        start, end = start % len(shape_in), end % len(shape_in)
        if t_in.axis < start or t_in.axis > end:  # the permuted axis is not flattened
            self.tags[node] = Tag(t_in.group, t_in.axis if t_in.axis < start else t_in.axis - (end - start))
        elif t_in.axis == start and all(n == 1 for n in shape_in[start + 1:end + 1]):
            self.tags[node] = Tag(t_in.group, start)
        else:
            block = 1
            for n in shape_in[t_in.axis + 1:end + 1]:
                block *= n
            self.refuse(node, f"a flatten that maps each channel onto a block of {block} features "
                              "(block permutations are not supported)")

    def function(self, node: fx.Node) -> None:
        target, tagged = node.target, self.tagged_inputs(node)
        method = target if node.op == "call_method" else None
        if not tagged:
            self.tags[node] = None
        elif target in MERGE_FUNCTIONS or method in ("add", "add_", "mul", "mul_", "__add__", "__mul__"):
            self.merge(node)
        elif target in CARRY_FUNCTIONS or method in ("relu", "relu_", "sigmoid", "tanh", "contiguous", "clone"):
            self.carry(node, tagged[0])
        elif target is torch.flatten or method == "flatten":
            start = node.args[1] if len(node.args) > 1 else node.kwargs.get("start_dim", 0)
            end = node.args[2] if len(node.args) > 2 else node.kwargs.get("end_dim", -1)
            self.flatten(node, tagged[0], start, end)
        elif method in ("view", "reshape") or target is torch.reshape:
            self.reshape(node, tagged[0])
        elif target is torch.mean or method == "mean":
            self.reduce(node, tagged[0])
        elif target in (getattr, operator.getitem) and self.shape(node) is None:
            self.tags[node] = None  # x.shape, x.size(…)[0]: not a tensor
        else:
            self.refuse(node, "an operation the tracer does not know")

    def merge(self, node: fx.Node) -> None:
        """x + y, x * y: the groups of both are one; an unpermuted tensor pins the group."""
        shape = self.shape(node)
        tensors = [a for a in node.all_input_nodes if self.shape(a) is not None]
        tagged = [self.tag(a) for a in tensors if self.tag(a) is not None]
        # broadcasting aligns trailing axes: an operand's axis k is the output's axis k + offset
        axes = {len(shape) - len(self.shape(a)) + self.tag(a).axis for a in tensors if self.tag(a) is not None}
        if len(axes) != 1:
            return self.refuse(node, "its operands are permuted on different axes")
        axis = axes.pop()
        g = tagged[0].group
        for t in tagged[1:]:
            g = self.groups.union(g, t.group)
        for a in tensors:  # an unpermuted operand that varies along the permuted axis pins it
            s, offset = self.shape(a), len(shape) - len(self.shape(a))
            if self.tag(a) is None and axis - offset >= 0 and s[axis - offset] != 1:
                g = self.groups.union(g, FIXED)
        self.tags[node] = Tag(g, axis)

    def reshape(self, node: fx.Node, t_in: Tag) -> None:
        shape_in, shape = self.shape(node.args[0]), self.shape(node)
        if shape == shape_in:
            self.tags[node] = t_in
        elif len(shape) == t_in.axis + 1 and shape[:t_in.axis] == shape_in[:t_in.axis] and \
                shape[t_in.axis] == shape_in[t_in.axis] and all(n == 1 for n in shape_in[t_in.axis + 1:]):
            self.tags[node] = t_in  # (N, C, 1, 1) -> (N, C): the same as flatten
        else:
            self.refuse(node, f"a reshape {shape_in} -> {shape} it cannot follow")

    def reduce(self, node: fx.Node, t_in: Tag) -> None:
        shape_in, shape = self.shape(node.args[0]), self.shape(node)
        dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        dims = [d % len(shape_in) for d in ((dims,) if isinstance(dims, int) else dims or ())]
        if not dims or t_in.axis in dims:
            return self.refuse(node, "a mean over the permuted axis")
        keep = len(shape) == len(shape_in)
        self.tags[node] = Tag(t_in.group, t_in.axis - (0 if keep else sum(d < t_in.axis for d in dims)))

    def name_of(self, gid: int | None) -> str | None:
        """Groups are named ``P_0, P_1, …`` in order of first use; FIXED ones are None."""
        root = None if gid is None else self.groups.find(gid)
        if root is None or root == FIXED:
            return None
        return self.names.setdefault(root, f"P_{len(self.names)}")

    def result(self, model: nn.Module) -> Traced:
        """The spec of ``model``'s state_dict (untouched entries: no permuted axis) and the AM points."""
        axes = {key: tuple(self.name_of(g) for g in self.axes[key]) if key in self.axes else (None,) * value.dim()
                for key, value in model.state_dict().items()}
        found: dict[str, dict[str, list[str]]] = {}
        for gid, modules in self.writers.items():
            if (name := self.name_of(gid)) is not None:
                for kind, module in modules:
                    found.setdefault(name, {}).setdefault(kind, []).append(module)
        points = {g: kinds.get("norm") or kinds["layer"] for g, kinds in found.items()}
        return Traced(PermutationSpec(axes=axes, stats=stats_of(axes)), points)


class Traced(NamedTuple):
    """The spec, and per group the modules whose outputs carry its units for activation matching:
    the norms that follow the layers writing it, or those layers themselves (pre-activation)."""

    spec: PermutationSpec
    points: dict[str, list[str]]
