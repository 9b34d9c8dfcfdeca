"""The pass of :mod:`lmclab.trace` over a ``torch.fx`` graph: one rule per kind of node (the rules that
change a tensor's shape live in :mod:`lmclab.trace.shapes`)."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import astuple

import torch
from torch import fx, nn

from lmclab.core.heads import Heads
from lmclab.core.spec import Entry, PermutationSpec, Segment, stats_of
from lmclab.trace.attention import AttentionRules
from lmclab.trace.calls import CALL_RULES, CallRules
from lmclab.trace.functional import FUNCTIONAL_RULES, FunctionalRules
from lmclab.trace.groups import (
    CARRY_FUNCTIONS,
    CARRY_MODULES,
    FIXED,
    LAST_AXIS_NORMS,
    MATMUL_FUNCTIONS,
    MERGE_FUNCTIONS,
    POOL_FUNCTIONS,
    POOL_MODULES,
    SOFTMAX_FUNCTIONS,
    Layout,
    Seg,
    Tag,
    Within,
    loaded_carry_functions,
)
from lmclab.trace.kinds import KindRules
from lmclab.trace.layers import LayerRules
from lmclab.trace.packed import SDPA, PackedRules
from lmclab.trace.pinned import COMBINED, PinnedRules
from lmclab.trace.rotary import RotaryRules
from lmclab.trace.routing import ROUTING_RULES, RoutingRules
from lmclab.trace.shapes import ShapeRules
from lmclab.trace.state import Traced, exponent_of, tensor_identity, unknown
from lmclab.trace.widths import WidthRules

RULES = FUNCTIONAL_RULES | CALL_RULES | ROUTING_RULES
CARRY_METHODS = {"relu", "relu_", "sigmoid", "tanh", "contiguous", "clone", "pow", "rsqrt", "sqrt", "neg", "exp"}
CARRY_METHODS |= {"to", "float", "double", "type_as"}
OWNING = {
    torch.nn.functional.linear,
    torch.nn.functional.embedding,
    torch.nn.functional.conv2d,
    torch.ops.aten.addmm.default,
    torch.addmm,
}


class GraphTracer(
    LayerRules,
    ShapeRules,
    AttentionRules,
    PackedRules,
    FunctionalRules,
    CallRules,
    RotaryRules,
    PinnedRules,
    RoutingRules,
    KindRules,
    WidthRules,
):
    """One pass over the graph in topological order, tagging each node's output: the rules of every mixin
    over one :class:`~lmclab.trace.state.TraceState` (``GraphTracer(gm, partial)``)."""

    # ---- helpers ----------------------------------------------------------------------------
    def unite(self, a: Layout, b: Layout) -> bool:
        """Merge two layouts segment by segment; False when their lengths differ. Of two segments in
        different blocks, the finer group is coarsened to the longer runs (grouped conv ⊙ its SE scale)."""
        if a is None or b is None:
            return a is None and b is None
        if any(isinstance(s, Within) for s in (*a, *b)):  # per-head features: of one group, or not alike
            return self.unite_within(a, b)
        for x, y in zip(a, b, strict=False):
            self.groups.join(x.gid, y.gid)
        a, b = [self.groups.resolve(s) for s in a], [self.groups.resolve(s) for s in b]
        if [s.length for s in a] != [s.length for s in b] or any(
            max(x.block, y.block) % min(x.block, y.block) or not self.groups.joinable(x.gid, y.gid)
            for x, y in zip(a, b, strict=True)
        ):
            return False
        for x, y in zip(a, b, strict=True):
            fine, coarse = (x, y) if x.block <= y.block else (y, x)
            gid = fine.gid if fine.block == coarse.block else self.groups.coarsen(fine.gid, coarse.block // fine.block)
            self.groups.union(gid, coarse.gid)
        return True

    def record(self, name: str, layouts: Sequence[Layout]) -> None:
        """Axes of a parameter; a module used twice must see the same groups (they are merged)."""
        headed = [s.gid for lay in layouts if lay is not None for s in lay if self.is_headed(s)]
        if any(self.groups.find(g) != FIXED for g in headed):
            self.cannot(headed, f"{name!r} would be permuted along a head axis, which no spec can say")
        if name in self.axes:  # an axis one use leaves unpermuted is unpermuted (a table tied to a head)
            for a, b in zip(self.axes[name], layouts, strict=True):
                if (a is None) != (b is None):
                    self.pin([s.gid for s in a or b], f"{name!r} is also used unpermuted along it")
                elif not self.unite(a, b):
                    self.cannot([s.gid for s in (*a, *b)], f"{name!r} is used on inputs permuted in different ways")
            return
        self.axes[name] = list(layouts)

    # ---- the pass ----------------------------------------------------------------------------
    def run(self) -> None:
        for node in self.gm.graph.nodes:
            self.groups.cause = self.cause_at(node)
            if node.op in ("placeholder", "get_attr"):
                self.tags[node] = None
            elif node.op == "output":
                for t in self.tagged_inputs(node):  # outputs are never permuted
                    self.pin(t.gids)
                self.pin([g for a in node.all_input_nodes for g in self.packed_gids(a)])
                self.pin([self.attention_heads[a][0] for a in node.all_input_nodes if a in self.attention_heads])
            elif any(a in self.packed or a in self.unbound for a in node.all_input_nodes):
                self.on_packed(node)
            elif node.op == "call_module":
                self.module(node, self.gm.get_submodule(str(node.target)))
            else:
                self.function(node)
            if (t := self.tags.get(node)) is not None and not self.well_formed(t):
                self.refuse(node, "per-head features beside no axis of their heads, or two")
            self.rotations(node)
            self.widths(node)

    def module(self, node: fx.Node, module: nn.Module) -> None:
        name, x = str(node.target), node.args[0] if node.args else None
        t_in = self.tag(x)
        if not self.knows_heads(node, [t_in], module):
            return self.refuse(node, "an operation over heads or per-head features it does not know")
        if isinstance(module, nn.MultiheadAttention):
            self.attention(node, name, module)
        elif isinstance(module, nn.Linear):
            self.layer(node, name, module, t_in, len(self.shape(node)) - 1, spatial=0)
        elif isinstance(module, nn.Conv2d):
            if t_in is not None and self.live(t_in) not in ([], [1]):
                return self.refuse(node, "a convolution over a permuted axis that is not its channel axis")
            self.conv(node, name, module, t_in)
        elif isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d, *LAST_AXIS_NORMS, nn.GroupNorm)):
            self.norm(node, name, module, t_in)
        elif isinstance(module, nn.Embedding):
            self.embedding_layer(node, name)
        elif isinstance(module, nn.Softmax):
            self.softmax(node, t_in, module.dim)
        elif isinstance(module, CARRY_MODULES):
            self.carry(node, t_in, pool=isinstance(module, POOL_MODULES))
        elif isinstance(module, nn.Flatten):
            self.flatten(node, t_in, module.start_dim, module.end_dim)
        elif self.tagged_inputs(node):
            self.refuse(node, "an operation the tracer does not know")
        else:
            self.tags[node] = None

    def function(self, node: fx.Node) -> None:
        target, tagged = node.target, self.tagged_inputs(node)
        method = target if node.op == "call_method" else None
        if target is operator.getitem and node.args[0] in self.attention_heads:
            return self.attention_item(node, node.args[0])
        if target is SDPA and tagged:
            return self.fused_attention(node)
        if not self.knows_heads(node, tagged):
            return self.refuse(node, self.heads_reason(node))
        if target in OWNING:  # a layer of the model's own parameters: a new group, even on the model's input
            return getattr(self, RULES[target])(node, tagged[0] if tagged else None)
        if not tagged:
            self.tags[node] = None
        else:
            self.tagged_function(node, method, tagged)

    def tagged_function(self, node: fx.Node, method: str | None, tagged: list[Tag]) -> None:
        """A function or method (``method``: its name) of tensors of which some are permuted (``tagged``)."""
        target = node.target
        if target in MERGE_FUNCTIONS or method in ("add", "add_", "mul", "mul_", "__add__", "__mul__", "div", "sub"):
            self.merge(node)
        elif target in (torch.pow, operator.pow) and isinstance(exponent_of(node), int | float):  # as x.pow(c)
            self.carry(node, tagged[0])
        elif target in CARRY_FUNCTIONS or target in loaded_carry_functions() or method in CARRY_METHODS:
            self.carry(node, tagged[0], pool=target in POOL_FUNCTIONS)
        elif target is torch.flatten or method == "flatten":
            start = node.args[1] if len(node.args) > 1 else node.kwargs.get("start_dim", 0)
            end = node.args[2] if len(node.args) > 2 else node.kwargs.get("end_dim", -1)
            self.flatten(node, tagged[0], start, end)
        elif method in ("view", "reshape") or target is torch.reshape:
            self.reshape(node, tagged[0])
        elif method in ("view_as", "reshape_as"):  # x.reshape_as(y) = x.reshape(y.shape) (timm's LeViT)
            self.reshape(node, t) if (t := self.tag(node.args[0])) is not None else self.tags.update({node: None})
        elif target in (torch.cat, torch.concat, torch.concatenate):
            self.cat(node)
        elif target in SOFTMAX_FUNCTIONS or method == "softmax":
            self.softmax(node, tagged[0])
        elif target in MATMUL_FUNCTIONS:
            self.matmul(node)
        elif target is operator.getitem and self.shape(node) is not None and self.shape(node.args[0]) is not None:
            self.index(node, tagged[0])
        elif target in (torch.mean, torch.sum) or method in ("mean", "sum"):
            self.reduce(node, tagged[0])
        elif target in (torch.transpose, torch.permute, torch.swapaxes) or method in (
            "transpose",
            "permute",
            "swapaxes",
        ):
            self.move(node, tagged[0])
        elif target in RULES:  # functional norms, pad, roll, expand, split
            getattr(self, RULES[target])(node, tagged[0])
        elif method == "expand":  # x.expand(*sizes): as aten.expand
            self.expand(node, tagged[0])
        elif (target is getattr or method in ("size", "dim")) and self.shape(node) is None:
            self.tags[node] = None  # x.shape, x.size(0): not a tensor
        else:
            self.refuse(node, unknown(node))

    def merge(self, node: fx.Node) -> None:
        """x + y, x * y (broadcast): on each axis the groups of the operands permuted there are one. An operand
        not permuted on such an axis, yet varying along it, pins the groups; unless it is a parameter or
        buffer of the model (a layer scale): it is then permuted alike."""
        shape, out, self.groups.cause = self.shape(node), [], self.cause_at(node, COMBINED)
        tensors = [a for a in node.all_input_nodes if self.shape(a) is not None]
        for axis in range(len(shape)):
            here = [lay for a in tensors if (lay := self.broadcast(a, axis, len(shape))) is not None]
            if here and not all(self.unite(here[0], lay) for lay in here[1:]):
                return self.refuse(node, "its operands are permuted in blocks or segments that differ")
            out.append(here[0] if here else None)
        for a in tensors:
            offset = len(shape) - len(self.shape(a))
            if self.tag(a) is None and (found := self.per_channel(a)) is not None:  # a layer scale, a gain 1 + w
                param, at = found
                if any(k is not None and out[k + offset] and any(map(self.is_headed, out[k + offset])) for k in at):
                    return self.refuse(node, "a parameter varying along heads or per-head features")
                self.record(str(param.target), [None if k is None else out[k + offset] for k in at])
                continue
            self.fix(self.varied(node, a, out))  # rotary cos/sin: whole heads, or turned per plane (planes)
        self.tags[node] = Tag.of(out)

    def broadcast(self, arg: fx.Node, axis: int, ndim: int) -> Layout:
        """The layout of ``arg`` on axis ``axis`` of a broadcast result of ``ndim`` axes (trailing axes align)."""
        t, k = self.tag(arg), axis - (ndim - len(self.shape(arg)))
        return None if t is None or k < 0 else t.at(k)

    def share_tied(self, identity: dict[str, object], state: dict[str, torch.Tensor]) -> None:
        """Entries that are one tensor (an embedding tied to the output head; ``identity``:
        :func:`lmclab.trace.state.tensor_identity`) are permuted alike: each axis by what every use of it allows
        (unpermuted where one use leaves it so)."""
        tied: dict[object, list[str]] = {}
        for key, same in identity.items():
            if state[key].dim():
                tied.setdefault(same, []).append(key)
        for keys in tied.values():
            used = [k for k in keys if k in self.axes]
            for key in used[1:]:
                self.record(used[0], self.axes[key])
            for key in keys:
                if used:
                    self.axes[key] = self.axes[used[0]]

    def name_of(self, gid: int) -> str | None:
        """Groups are named ``P_0, P_1, …`` in order of first use; FIXED ones are None."""
        root = self.groups.find(gid)
        return None if root == FIXED else self.names.setdefault(root, f"P_{len(self.names)}")

    def entry(self, layout: Layout) -> Entry:
        """A layout as a spec axis: a group name when plain, segments when composite, None if all pinned."""
        if layout is None:
            return None
        named = [Segment(self.name_of(r.gid), *astuple(r)[1:]) for r in map(self.groups.resolve, layout)]
        if all(s.group is None for s in named):
            return None
        return named[0].group if len(named) == 1 and named[0][2:] == (1, 1, 1) else tuple(named)

    def result(self, model: nn.Module) -> Traced:
        """The spec of ``model``'s state_dict (untouched entries: no permuted axis) and the AM points."""
        state = model.state_dict()
        identity = tensor_identity(model, state)  # on the meta device too: a model built without weights
        self.share_tied(identity, state)
        self.settle_rigid()
        self.groups.pin_ties()
        axes = {
            key: tuple(self.entry(lay) for lay in self.axes[key]) if key in self.axes else (None,) * value.dim()
            for key, value in state.items()
        }
        ties: dict[int, str] = {}
        heads = {
            self.names[root]: Heads(count, ties.setdefault(self.groups.find(tie), f"P_heads_{len(ties)}"))
            for root, (count, tie) in self.groups.heads.items()
            if root in self.names
        }
        found: dict[str, dict[str, list[str]]] = {}
        for gid, points in self.writers.items():  # a group coarsened to runs (heads that move whole): ``:run``
            if (name := self.name_of((seg := self.groups.resolve(Seg(gid, 1))).gid)) and seg.copies == 1:
                for kind, point in points:
                    found.setdefault(name, {}).setdefault(kind, []).append(point + f":{seg.block}" * (seg.block > 1))
        points = {g: kinds.get("norm") or kinds["layer"] for g, kinds in found.items()}
        axes, *kinded = self.kinded(axes, identity)  # kinds, gains, biases, offsets, reasons (.kinds)
        spec = PermutationSpec(axes, stats_of(axes), heads, self.pinned_record(), *kinded)
        return Traced(spec, points, self.fixed_widths(), tuple(self.scalars))
