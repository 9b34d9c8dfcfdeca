"""The rules of :mod:`lmclab.trace` that prove a headed group *rotary* (:mod:`lmclab.core.heads`): under
``symmetry="orthogonal"``, the rotary embedding of a head's queries and keys commutes with a rotation of each
plane ``(j, j + d/2)`` of its features, ``R = ⊕_j R(φ_j)``. Mixed into :class:`lmclab.trace.graph.GraphTracer`
(through :class:`lmclab.trace.rotary.RotaryRules`).

RoPE (Su et al. 2021, *RoFormer*, eq. 34) is ``q' = q ⊙ cos + rotate_half(q) ⊙ sin``, ``rotate_half(q) =
cat(−q[d/2:], q[:d/2])``. Each of its parts commutes with every such ``R``, and the tracer proves each from the
graph, never from a model's name:

- a product by a tensor *constant on each plane* (entries ``j`` and ``j + d/2`` equal along the per-head axis:
  ``cos``, ``sin``) is ``diag(c)`` with ``c`` one number on each plane, which commutes with any map of the
  plane. Proved by value for a stored tensor (a buffer, ``torch.equal`` of its halves) and structurally for one
  computed in the graph: ``cat((f, f))`` along the axis, then elementwise ops (``cos``, ``sin``, a scaling, a
  cast), new axes and indexes that keep the axis whole (Hugging Face's Llama, whose values ``torch.export``
  does not hold);
- ``rotate_half`` is ``J = ⊕_j R(π/2)``, which commutes with ``R``; ``cat(q[:d/2], q[d/2:])`` is ``q``;
- the halves ``q[:d/2]`` and ``q[d/2:]`` commute with no rotation on their own: they are read in place (the
  heads move whole, :meth:`lmclab.trace.groups.Groups.make_rigid`) unless every use of them builds ``±q`` or
  ``±J q`` of the same tensor.

A map mixing two planes commutes with none of it (the two planes turn by different angles ``θ_j t``), and
neither does a permutation inside a head: under ``symmetry="permutation"`` nothing here runs, and the heads of a
rotary embedding move whole as before. A group turned per plane that another node bends is made rigid at the
end (:meth:`settle_planes`); one that no node bends is ``rotary`` (:mod:`lmclab.trace.kinds`).
"""

from __future__ import annotations

import operator

import torch
from torch import fx

from lmclab.trace.groups import FIXED, Seg, Within
from lmclab.trace.shapes import ELEMENTWISE_FUNCTIONS, ELEMENTWISE_METHODS
from lmclab.trace.state import TraceState, dim_of

A = torch.ops.aten
PLANE = "rotary positions turn each plane (j, j + d/2) by its own angle"
NEGATIONS = {operator.neg, torch.neg, A.neg.default, "neg"}
PRODUCTS = {operator.mul, torch.mul, operator.imul, "mul", "mul_", "__mul__"}
CATS = {torch.cat, torch.concat, torch.concatenate}
# elementwise ops of tables constant on each plane and numbers give one (dropout draws per entry: not it)
PAIRING = ELEMENTWISE_FUNCTIONS - {torch.nn.functional.dropout, A.dropout.default}
PAIRING |= {torch.cos, torch.sin, A.cos.default, A.sin.default}
PAIRING_METHODS = ELEMENTWISE_METHODS | {"cos", "sin"}
FIRST_ONLY = {"to", "type_as", A.type_as.default}
DEPTH = 64  # ops followed back from a product to the tables it reads


class PlaneRules(TraceState):
    """Reads and writes the tracer's state (:class:`~lmclab.trace.state.TraceState`) alone."""

    def varied(self, node: fx.Node, arg: fx.Node, out: list) -> list[Seg | Within]:
        """The segments of ``out`` (the layouts of ``node``, a broadcast sum or product) along which its
        unpermuted operand ``arg`` varies, to read in place; but per-head features ``arg`` multiplies by a table
        constant on each plane are turned per plane (module docstring) and left free."""
        shape, s = self.shape(node), self.shape(arg)
        offset = len(shape) - len(s)
        return [
            seg
            for k, n in enumerate(s)
            if n != 1 and self.broadcast(arg, k + offset, len(shape)) is None
            for seg in out[k + offset] or ()
            if not self._turned(node, arg, seg, k - len(s))
        ]

    def _turned(self, node: fx.Node, arg: fx.Node, seg: Seg | Within, axis: int) -> bool:
        """``node`` multiplies the per-head features ``seg`` by ``arg``, constant on each plane along ``axis``."""
        if self.symmetry != "orthogonal" or not _calls(node, PRODUCTS) or not self._planar(seg):
            return False
        if not self.paired(arg, axis):
            return False
        self.planes.setdefault(seg.gid, f"node {node.name!r}: {PLANE}")
        return True

    def _planar(self, seg: Seg | Within) -> bool:
        """Per-head features, of heads whose order is free, that may still turn per plane (not read in place)."""
        root = self.groups.find(seg.gid) if isinstance(seg, Within) else FIXED
        return root != FIXED and root not in self.groups.rigid and self.groups.tie_of(root) not in (None, FIXED)

    def paired(self, node: fx.Node, axis: int, depth: int = 0) -> bool:
        """Whether the entries ``j`` and ``j + n/2`` of ``node`` along ``axis`` (negative: from the last) are
        equal, proved by value for a stored tensor, else from the ops that compute it (module docstring)."""
        shape = self.shape(node)
        if shape is None or depth > DEPTH:
            return False
        if len(shape) < -axis or shape[axis] == 1:  # constant along the axis (broadcast)
            return True
        if shape[axis] % 2:
            return False
        if node.op == "get_attr":
            value, half = _attribute(self.gm, str(node.target)), shape[axis] // 2
            return isinstance(value, torch.Tensor) and torch.equal(
                value.narrow(axis, 0, half), value.narrow(axis, half, half)
            )
        source = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else None
        if _calls(node, FIRST_ONLY) and source is not None:  # x.to(y), x.type_as(y): y gives the dtype alone
            return self.paired(source, axis, depth + 1)
        if _calls(node, PAIRING) or (node.op == "call_method" and node.target in PAIRING_METHODS):
            tensors = [a for a in node.all_input_nodes if self.shape(a) is not None]  # numbers are constant
            return all(self.paired(a, axis, depth + 1) for a in tensors)
        if _calls(node, CATS):
            parts, dim = list(node.args[0]), dim_of(node, 1, 0) % len(shape) - len(shape)
            if dim == axis:
                return len(parts) == 2 and parts[0] is parts[1]
            return all(self.paired(a, axis, depth + 1) for a in parts)
        if source is None or self.shape(source) is None:
            return False
        if _calls(node, {operator.getitem}) and (found := self._picked(node, axis)) is not None:
            return self.paired(source, found, depth + 1)
        if _calls(node, {torch.unsqueeze, "unsqueeze"}):  # a new axis before ``axis`` keeps it (x[None] above too)
            return self.shape(source)[axis:] == shape[axis:] and self.paired(source, axis, depth + 1)
        return False

    def _picked(self, node: fx.Node, axis: int) -> int | None:
        """The axis of ``x`` that ``node = x[items]`` (ints, slices, None) shows whole at its ``axis``."""
        items = _items(node.args[1], len(self.shape(node.args[0])))
        if items is None:
            return None
        out = [k for k, i in enumerate(items) if i is None or isinstance(i, slice)]  # output axis -> item
        item = items[out[axis]]
        if item != slice(None):  # a new axis of length 1 is constant (paired() above); a part, not whole
            return None
        return sum(i is not None for i in items[: out[axis]]) - len(self.shape(node.args[0]))

    def halved(self, node: fx.Node, within: Within) -> bool:
        """``node`` is a half of the per-head features ``within`` whose every use builds ``±x`` or ``±J x``
        (``rotate_half``) of the tensor it halves: left free, not read in place (module docstring)."""
        if self.symmetry != "orthogonal" or not self._planar(within) or _half(self, node) is None:
            return False
        return all(
            self.cat_turn(user) is not None
            or (_calls(user, NEGATIONS) and all(self.cat_turn(u) is not None for u in user.users))
            for user in node.users
        )

    def turned_halves(self, node: fx.Node, within: Within) -> bool:
        """The concatenation ``node`` of halves of ``within`` is ``±x`` or ``±J x``: free features (``J``
        turns each plane, :attr:`planes`)."""
        turn = self.cat_turn(node) if self._planar(within) else None  # halves left free: symmetry="orthogonal"
        if turn == "J":
            self.planes.setdefault(within.gid, f"node {node.name!r}: {PLANE}")
        return turn is not None

    def cat_turn(self, node: fx.Node) -> str | None:
        """``"J"`` when ``node`` is ``cat((∓x[d/2:], ±x[:d/2]))`` along the halved axis (``±J x``),
        ``"identity"`` for ``cat((±x[:d/2], ±x[d/2:]))`` (``±x``); None for anything else."""
        if not _calls(node, CATS) or not isinstance(node.args[0], list | tuple) or len(node.args[0]) != 2:
            return None
        parts = [_signed_half(self, a) for a in node.args[0]]
        if None in parts or parts[0][0] is not parts[1][0] or parts[0][1] != parts[1][1]:
            return None
        (_, axis, first, sign), (_, _, second, other) = parts
        if axis != dim_of(node, 1, 0) % len(self.shape(node)):
            return None
        if (first, second) == (1, 0) and sign != other:
            return "J"
        return "identity" if (first, second) == (0, 1) and sign == other else None

    def settle_planes(self) -> None:
        """A group turned per plane that a node bends or centres takes no rotary map: its heads move whole, as
        under ``symmetry="permutation"``."""
        narrow = {self.groups.find(g) for g in (*self.bent, *self.centred)}
        for gid in self.planes:
            if self.groups.find(gid) in narrow:
                self.groups.make_rigid(gid)


def _calls(node: fx.Node, targets: set) -> bool:
    """``node`` calls a function or method of ``targets`` (not a module that happens to be named alike)."""
    return node.op in ("call_function", "call_method") and node.target in targets


def _attribute(gm: fx.GraphModule, target: str) -> object:
    """The value a ``get_attr`` node reads (a buffer, a constant torch.fx copied out of ``forward``)."""
    path, _, name = target.rpartition(".")
    return getattr(gm.get_submodule(path), name, None)


def _items(index: object, ndim: int) -> list | None:
    """An index of ints, slices, None and at most one Ellipsis, one item per axis (None: new axes); None for an
    index by tensors."""
    items = index if isinstance(index, tuple) else (index,)
    if sum(i is Ellipsis for i in items) > 1 or not all(
        i is None or i is Ellipsis or isinstance(i, int | slice) for i in items
    ):
        return None
    rest = ndim - sum(i is not None and i is not Ellipsis for i in items)
    items = [j for i in items for j in ([slice(None)] * rest if i is Ellipsis else [i])]
    return items + [slice(None)] * (ndim + sum(i is None for i in items) - len(items))


def _half(rules: PlaneRules, node: fx.Node) -> tuple[fx.Node, int, int] | None:
    """``(x, axis, 0)`` for ``node = x[…, :n/2]``, ``(x, axis, 1)`` for ``x[…, n/2:]`` (by their lengths: the
    bounds may be graph values, ``x.shape[-1] // 2``); None for any other index."""
    if not _calls(node, {operator.getitem}) or not isinstance(node.args[0], fx.Node):
        return None
    shape_in, shape = rules.shape(node.args[0]), rules.shape(node)
    items = _items(node.args[1], len(shape_in)) if shape_in and shape else None
    if items is None or not all(isinstance(i, slice) for i in items):
        return None
    cut = [k for k, i in enumerate(items) if i != slice(None)]
    if len(cut) != 1 or items[cut[0]].step not in (None, 1):
        return None
    axis, item, n = cut[0], items[cut[0]], shape_in[cut[0]]
    if n % 2 or shape[axis] != n // 2:
        return None
    if item.start in (None, 0):
        return node.args[0], axis, 0
    return (node.args[0], axis, 1) if item.stop is None or (isinstance(item.stop, int) and item.stop >= n) else None


def _signed_half(rules: PlaneRules, node: object) -> tuple[fx.Node, int, int, int] | None:
    """``(x, axis, half, sign)`` for a half of ``x`` (:func:`_half`), negated or not."""
    sign = 1
    if isinstance(node, fx.Node) and _calls(node, NEGATIONS) and isinstance(node.args[0], fx.Node):
        node, sign = node.args[0], -1
    found = _half(rules, node) if isinstance(node, fx.Node) else None
    return None if found is None else (*found, sign)
