"""Which groups may differ in width between two models: the tracer's proof that the narrower model, embedded in
the wider one's widths with empty units (:mod:`lmclab.core.widths`), computes its own function.

An empty unit is 0 after every linear write (its row is zero, and so is its bias) and after a BatchNorm (zero gain
and bias), ``f(0)`` after an elementwise ``f``; every linear layer that reads it has a zero column there. So the
embedding keeps the function as long as every operation on the group's units is one of

- a linear read or write: ``nn.Linear``/``F.linear``, ``nn.Embedding``, a convolution of one group, an ``addmm``;
- unit by unit: a sum, difference or product of tensors (a residual add, a gate ``silu(g) ⊙ u``), a product by a
  constant or a parameter, an elementwise function finite at 0 (ReLU, GELU, SiLU, tanh, sigmoid, …), BatchNorm,
  dropout, a pooling or mean over other axes (the image's), a mean or sum over other axes;
- moving and copying: reshapes, transposes, concatenation, splits, indexing other axes, casts.

Anything else fixes the width of the groups it touches, with the node as the reason: a norm over the units
(LayerNorm, RMSNorm, GroupNorm: their mean and variance count the empty units), a softmax, a mean or sum over
them, a quotient by them or a function infinite at 0 (``1/0`` meets the zero column as NaN), a matrix product
(attention's scores and its scale), an operation no rule knows. A headed group (its units are the heads'
features, and an empty head feature changes the head's scale) and a group read in runs or copies keep their
width too. The graph's numbers (a scale ``1/√width`` computed in ``forward``) are recorded in :attr:`scalars`:
two models whose numbers differ are not one architecture at two widths (:func:`lmclab.api.align` compares them).
"""

from __future__ import annotations

import operator

import torch
from torch import fx, nn

from lmclab.trace.rotations import ADDITIVE, LINEAR_FUNCTIONS, LINEAR_MODULES, METADATA, METHODS, MOVING, SCALING
from lmclab.trace.state import TraceState

F = torch.nn.functional
A = torch.ops.aten
UNIT_MODULES = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.Dropout, nn.Dropout2d, nn.Identity, nn.Flatten)
UNIT_MODULES += (nn.ReLU, nn.ReLU6, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.LeakyReLU, nn.ELU, nn.SELU, nn.Mish)
UNIT_MODULES += (nn.Hardswish, nn.Hardsigmoid, nn.Hardtanh, nn.Softplus)
POOLS = {nn.MaxPool1d: 1, nn.MaxPool2d: 2, nn.AvgPool1d: 1, nn.AvgPool2d: 2, nn.AdaptiveAvgPool1d: 1}
POOLS |= {nn.AdaptiveAvgPool2d: 2, nn.AdaptiveMaxPool2d: 2}
POOL_FUNCTIONS = {F.max_pool2d: 2, F.avg_pool2d: 2, F.adaptive_avg_pool2d: 2, F.adaptive_max_pool2d: 2}
ELEMENTWISE = {F.relu, torch.relu, F.relu6, F.gelu, F.silu, torch.tanh, F.tanh, torch.sigmoid, F.sigmoid, F.elu}
ELEMENTWISE |= {F.leaky_relu, F.hardswish, F.hardsigmoid, F.hardtanh, F.mish, F.softplus, torch.erf, torch.exp}
ELEMENTWISE |= {torch.abs, torch.clamp, torch.square, torch.where, F.batch_norm, F.dropout, torch.cos, torch.sin}
ELEMENTWISE |= {A.relu.default, A.gelu.default, A.silu.default, A.tanh.default, A.sigmoid.default, A.erf.default}
ELEMENTWISE |= {A._native_batch_norm_legit_no_training.default, A.add.Tensor, A.mul.Tensor, A.sub.Tensor}
ELEMENTWISE_METHODS = {"relu", "relu_", "sigmoid", "tanh", "exp", "sqrt", "neg", "clamp", "square", "erf"}
ELEMENTWISE_METHODS |= {"masked_fill"}
POWERS = {torch.pow, operator.pow, "pow", A.pow.Tensor_Scalar}
QUOTIENTS = {operator.truediv, torch.div, A.div.Tensor, "div"}
FIXING = {
    F.layer_norm: "a LayerNorm over the units (its mean and variance count the empty ones)",
    F.rms_norm: "an RMSNorm over the units (its mean square counts the empty ones)",
    F.group_norm: "a GroupNorm over the units (its statistics count the empty ones)",
    F.softmax: "a softmax",
    F.scaled_dot_product_attention: "attention (its scale reads the heads' width)",
}

NORMS = {nn.LayerNorm: FIXING[F.layer_norm], nn.RMSNorm: FIXING[F.rms_norm], nn.GroupNorm: FIXING[F.group_norm]}
NORMS |= {nn.Softmax: FIXING[F.softmax], nn.MultiheadAttention: "attention (its scale reads the heads' width)"}


class WidthRules(TraceState):
    """:meth:`widths` after each node's own rule (module docstring)."""

    def widths(self, node: fx.Node) -> None:
        """Fix the width of the groups of ``node``'s inputs and output unless ``node`` reads them linearly or unit
        by unit; record the numbers of its arguments."""
        self.scalars.extend((node.name, v) for v in _numbers((node.args, node.kwargs)))
        if node.op == "call_module":  # a module's own numbers: eps, a slope, a scale kept as an attribute
            module = self.gm.get_submodule(str(node.target))
            self.scalars.extend((node.name, v) for _, v in sorted(vars(module).items()) if isinstance(v, float))
        tagged = [a for a in node.all_input_nodes if self.tag(a) is not None]
        if not tagged or node.op == "output":
            return
        reason = self._fixes(node, tagged)
        if reason is not None:
            gids = [g for a in tagged for g in self.tag(a).gids] + (self.tag(node).gids if self.tag(node) else [])
            for gid in gids:
                self.fixed.setdefault(gid, f"node {node.name!r}: {reason}")

    def _fixes(self, node: fx.Node, tagged: list[fx.Node]) -> str | None:
        """Why ``node`` does not keep an empty unit harmless (None: it does)."""
        if node.op == "call_module":
            module = self.gm.get_submodule(str(node.target))
            if type(module) in POOLS:
                return self._pooled(tagged[0], POOLS[type(module)])
            if isinstance(module, LINEAR_MODULES + UNIT_MODULES):
                return None
            if isinstance(module, nn.Conv1d | nn.Conv2d | nn.Conv3d):
                return None if module.groups == 1 else "a grouped convolution"
            return NORMS.get(type(module), f"{type(module).__name__} reads the units together")
        target = node.target
        kind = METHODS.get(target) if node.op == "call_method" else None
        if target in QUOTIENTS and len(node.args) > 1 and node.args[1] in tagged:
            return "a quotient by the units (an empty one divides by zero)"
        if target in ADDITIVE or target in SCALING or kind in ("+", "*", "move") or target in MOVING:
            return None
        if target in LINEAR_FUNCTIONS or target in ELEMENTWISE or target in ELEMENTWISE_METHODS:
            return None
        if target in POWERS:  # x ** p, finite at 0 for p > 0 (GPT-2's GELU: x³)
            exponent = node.args[1] if len(node.args) > 1 else node.kwargs.get("exponent")
            return None if isinstance(exponent, int | float) and exponent > 0 else "a power not finite at 0"
        if target is F.conv2d:
            groups = node.args[6] if len(node.args) > 6 else node.kwargs.get("groups", 1)
            return None if groups == 1 else "a grouped convolution"
        if target is getattr and len(node.args) > 1 and node.args[1] in METADATA:
            return None
        if target in POOL_FUNCTIONS:
            return self._pooled(tagged[0], POOL_FUNCTIONS[target])
        if target in (torch.mean, torch.sum) or kind == "reduce":
            return "a mean or sum over the units" if self._over_units(node) else None
        return FIXING.get(target, "an operation that reads the units together (or one the width rules do not know)")

    def _pooled(self, arg: fx.Node, spatial: int) -> str | None:
        """A pooling over the last ``spatial`` axes: unit by unit unless it pools a permuted axis."""
        ndim = len(self.shape(arg) or ())
        return "a pooling over the units" if any(a >= ndim - spatial for a in self.tag(arg).permuted) else None

    def _over_units(self, node: fx.Node) -> bool:
        """A mean or sum over a permuted axis of its input (every axis when none is named)."""
        shape = self.shape(node.args[0]) or ()
        dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        dims = range(len(shape)) if dims is None else (dims,) if isinstance(dims, int) else dims
        return any(d % max(len(shape), 1) in self.tag(node.args[0]).permuted for d in dims)

    def fixed_widths(self) -> dict[str, str]:
        """Each named group whose width the pass fixed, with the first reason; headed groups and those read in runs
        or copies (:meth:`lmclab.trace.groups.Groups`) with theirs."""
        find, first = self.groups.find, {}
        for gid, reason in self.fixed.items():
            first.setdefault(find(gid), reason)
        for gid in self.groups.heads:
            first.setdefault(find(gid), "its units are attention heads' features (the heads' scale reads them)")
        for gid, (coarse, _) in self.groups.coarse.items():
            for g in (gid, coarse):
                first.setdefault(find(g), "it is read in runs of units (whole heads, a grouped convolution's groups)")
        return {name: first[root] for root, name in self.names.items() if root in first}


def _numbers(value: object) -> list[float]:
    """The floats among a node's arguments, nested containers included (ints are shapes: they differ)."""
    if isinstance(value, float):
        return [value]
    if isinstance(value, list | tuple):
        return [x for v in value for x in _numbers(v)]
    if isinstance(value, dict):
        return [x for v in value.values() for x in _numbers(v)]
    return []
