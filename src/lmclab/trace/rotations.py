"""Which groups an orthogonal map may act on: the tracer's proof of a group's *kind* (:mod:`lmclab.core.orthogonal`).

A permutation of units commutes with every elementwise operation; an orthogonal map ``O`` only with those
linear in the units. After each node's rule the pass asks whether the node commutes with ``O`` on every
group it touches; if not, those groups are *bent* — kept permutation groups — with the node as the reason.
What commutes with ``O`` (``Ox`` in, ``Ox`` out, or the units read away):

- linear reads and writes: ``nn.Linear``/``F.linear``, ``nn.Embedding``/``F.embedding``, a convolution of
  one group (``groups=1``), an ``addmm``;
- sums and differences of tensors of the group (a residual add; a bias add of a parameter along the units,
  rotated with them: ``O(x + b) = Ox + Ob``), not of a constant (``O(x + c·1) ≠ Ox + c·1``);
- a product or quotient by a tensor constant along the group's axis (a per-token scale ``x · rsqrt(ms)``);
- moving and copying: reshapes, transposes, concatenation, splits (GPT-2's packed ``c_attn``), indexing other
  axes, casts, dropout; reading
  ``x.shape`` or ``x.dtype``;
- a matrix product (``@``, ``F.scaled_dot_product_attention``): it is linear in each operand, and an axis it
  contracts holds one group on both operands (the permutation rules see to it), ``(A Oᵀ)(O B) = AB``: the
  features of a head's queries and keys, rotated alike, keep ``qᵀk``; its values, rotated, rotate the output;
- ``‖x‖²``: a square (``x.pow(2)``, ``x * x``) summed or averaged over the group's axis, which ``O`` keeps;
- a norm whose gain is a per-channel vector ``g`` read only by linear layers (RMSNorm: ``g ⊙ x/rms(x)``):
  not with ``g`` in place (``diag(g) O ≠ O diag(g)``), but once ``g`` is folded into the layers that read
  it (``W ← W diag(g)``, ``g ← 1``; an ``addmm``'s ``(in, out)`` weight, GPT-2's ``Conv1D``, not square:
  ``W ← diag(g) W``; :func:`lmclab.core.canonical.fold_gains`), read directly or through copies and reshapes
  that keep the units on the last axis. The tracer records such gains
  and their readers in :attr:`lmclab.core.spec.PermutationSpec.gains`; a gain read as ``c + w`` (Gemma's
  ``1 + w``) is folded as ``c + w``, leaving ``w = 1 − c``.

Anything else bends the groups it touches: an elementwise nonlinearity, a product of two tensors of the
group, LayerNorm's centring, BatchNorm, softmax, a pooling by maximum, a gain read by anything but a linear
layer, a gain computed from a parameter otherwise than ``c + w``. A headed group left unbent is orthogonal inside
each head (:mod:`lmclab.core.heads`), or rotary where rotary positions turn its planes (:mod:`lmclab.trace.planes`);
heads that move whole (grouped queries) and those of an ``nn.MultiheadAttention`` kept whole stay permutation groups.
"""

from __future__ import annotations

import operator

import torch
from torch import fx, nn

from lmclab.trace.calls import SPLITS
from lmclab.trace.groups import FIXED, Seg
from lmclab.trace.state import TraceState, dim_of

F = torch.nn.functional
LINEAR_MODULES = (nn.Linear, nn.Embedding)
MOVING_MODULES = (nn.Dropout, nn.Identity, nn.Flatten)
COPYING_MODULES = (nn.Dropout, nn.Identity)  # identities in eval mode: timm's fc_norm and head_drop
LINEAR_FUNCTIONS = {F.linear, F.embedding, torch.ops.aten.addmm.default, torch.addmm}
ADDITIVE = {operator.add, torch.add, operator.iadd, operator.sub, torch.sub, operator.neg, torch.neg}
ADDITIVE |= {torch.ops.aten.neg.default}
SCALING = {operator.mul, torch.mul, operator.imul, operator.truediv, torch.div}
SCALING |= {torch.ops.aten.mul.Scalar, torch.ops.aten.div.Scalar}
MOVING = {torch.flatten, torch.reshape, torch.transpose, torch.permute, torch.swapaxes, operator.getitem}
MOVING |= {torch.cat, torch.concat, torch.concatenate, F.dropout, torch.unsqueeze, torch.squeeze}
A = torch.ops.aten
MOVING |= {t for t in SPLITS if not isinstance(t, str)} | {torch.unbind, A.unbind.int}  # parts of their own groups
MOVING |= {A.dropout.default, A.clone.default, A.alias.default, A.detach.default, A.contiguous.default}
MOVING |= {A.to.dtype, A.to.dtype_layout, A.to.device, A._to_copy.default, A.type_as.default, A.expand.default}
COPYING = {F.dropout, A.dropout.default, A.clone.default, A.alias.default, A.detach.default, A.contiguous.default}
COPYING |= {A.to.dtype, A.to.dtype_layout, A.to.device, A._to_copy.default, A.type_as.default}
PRODUCTS = {operator.matmul, torch.matmul, F.scaled_dot_product_attention}  # bilinear: module docstring
ADDMM = {torch.addmm, A.addmm.default}  # bias + x @ W: a linear read of x along W's rows
COPYING_METHODS = {"to", "float", "double", "half", "bfloat16", "type_as", "contiguous", "clone"}
METADATA = ("shape", "dtype", "device", "ndim")  # attributes of a tensor that read none of its values
CENTRED = "centred: "  # the reason of a node that commutes with the centred maps only (O1 = 1)
METHODS = {"add": "+", "add_": "+", "__add__": "+", "sub": "+", "neg": "+", "mul": "*", "mul_": "*", "__mul__": "*"}
METHODS |= {"div": "*"} | dict.fromkeys(("mean", "sum"), "reduce")
METHODS |= dict.fromkeys(("view", "reshape", "view_as", "reshape_as", "flatten", "transpose", "permute"), "move")
METHODS |= dict.fromkeys(("swapaxes", "contiguous", "clone", "to", "float", "double", "type_as", "expand"), "move")
METHODS |= dict.fromkeys(("unsqueeze", "squeeze", "size", "dim", "half", "bfloat16"), "move")
METHODS |= dict.fromkeys(("split", "chunk", "unbind"), "move")


class RotationRules(TraceState):
    """The kind of every group (module docstring): :meth:`rotations` after each node's own rule."""

    def bend(self, gids: list[int], reason: str) -> None:
        for gid in gids:
            self.bent.setdefault(gid, reason)

    def rotations(self, node: fx.Node) -> None:
        """Bend the groups of ``node``'s inputs and output unless ``node`` commutes with orthogonal maps of them
        (only when the kinds are asked for: the permutation spec needs none of it)."""
        tagged = [a for a in node.all_input_nodes if self.tag(a) is not None]
        if self.symmetry != "orthogonal" or not tagged or node.op == "output":
            return
        gids = [g for a in tagged for g in self.tag(a).gids] + (self.tag(node).gids if self.tag(node) else [])
        for a in tagged:
            if a in self.squares and not self._sums_square(node, a):
                self.bend(self.tag(a).gids, f"node {a.name!r}: a square of the units read otherwise than summed")
        reason = self._breaks(node, tagged)
        if reason is not None and reason.startswith(CENTRED):  # only the centred maps commute with it
            for gid in gids:
                self.centred.setdefault(gid, f"node {node.name!r}: {reason.removeprefix(CENTRED)}")
        elif reason is not None:
            self.bend(gids, f"node {node.name!r}: {reason}")

    def _breaks(self, node: fx.Node, tagged: list[fx.Node]) -> str | None:
        """Why ``node`` does not commute with an orthogonal map of its groups (None: it does)."""
        if node.op == "call_module":
            return self._module_breaks(node, self.gm.get_submodule(str(node.target)))
        target = node.target
        kind = METHODS.get(target) if node.op == "call_method" else None
        if target in ADDITIVE or kind == "+":
            return self._shift_breaks(node, tagged)
        if target in LINEAR_FUNCTIONS or target in MOVING or target in PRODUCTS or kind == "move":
            return None
        if target is getattr and len(node.args) > 1 and node.args[1] in METADATA:  # x.shape: no value is read
            return None
        if target is F.conv2d:
            return None if _conv_groups(node) == 1 else "a grouped convolution"
        if target in (F.rms_norm, F.layer_norm):  # (input, normalized_shape, weight, …)
            weight = node.args[2] if len(node.args) > 2 else node.kwargs.get("weight")
            stored = _stored(weight) if isinstance(weight, fx.Node) else None
            reason = None if weight is None else self.gained(node, str(stored.target)) if stored else "a norm's gain"
            bias = node.args[3] if target is F.layer_norm and len(node.args) > 3 else node.kwargs.get("bias")
            if reason is None and stored and bias is not None:
                if not isinstance(bias, fx.Node) or (found := _stored(bias)) is None:
                    return "a LayerNorm's bias that is no parameter"
                self.gain_biases[str(stored.target)] = str(found.target)
            return reason or (CENTRED + "LayerNorm's centring" if target is F.layer_norm else None)
        if _is_square(node):
            self.squares.add(node)
            return None
        if target in SCALING or kind == "*":
            return self._scale_breaks(node, tagged)
        if target in (torch.mean, torch.sum) or kind == "reduce":
            square = node.args[0] in self.squares  # ‖x‖²: its sum over the units is what O keeps
            return None if square or not self._reduces_units(node) else CENTRED + "a sum over the units"
        return "an operation that does not commute with rotations of its units"

    def _module_breaks(self, node: fx.Node, module: nn.Module) -> str | None:
        if isinstance(module, LINEAR_MODULES + MOVING_MODULES):
            return None
        if isinstance(module, nn.Conv2d):
            return None if module.groups == 1 else "a grouped convolution"
        if isinstance(module, nn.RMSNorm | nn.LayerNorm):
            reason = None if module.weight is None else self.gained(node, f"{node.target}.weight")
            if reason is None and module.weight is not None and getattr(module, "bias", None) is not None:
                self.gain_biases[f"{node.target}.weight"] = f"{node.target}.bias"
            return reason or (CENTRED + "LayerNorm's centring" if isinstance(module, nn.LayerNorm) else None)
        return f"{type(module).__name__} does not commute with rotations of its units"

    def _scale_breaks(self, node: fx.Node, tagged: list[fx.Node]) -> str | None:
        """A product or quotient: by factors constant along every permuted axis of the result, or by one
        per-channel gain (:meth:`gained`)."""
        if len(tagged) > 1:
            return "a product of two tensors of the group"
        divide = node.target in (operator.truediv, torch.div, torch.ops.aten.div.Scalar) or node.target == "div"
        if divide and len(node.args) > 1 and node.args[1] in tagged:
            return "a quotient by the units"
        shape, tag = self.shape(node), self.tag(node)
        permuted = [] if tag is None else [a for a in tag.permuted if self._live(tag.at(a))]
        for arg in node.all_input_nodes:
            s = self.shape(arg)
            if arg in tagged or s is None:
                continue
            varies = [a for a in permuted if a - (len(shape) - len(s)) >= 0 and s[a - (len(shape) - len(s))] != 1]
            if varies == [len(shape) - 1] and (gain := _stored(arg)) is not None:  # along the units linear layers read
                return self.gained(node, str(gain.target))
            if varies == [len(shape) - 1] and (found := _offset_gain(arg)) is not None:  # Gemma's 1 + w
                offset, gain = found
                reason = self.gained(node, str(gain.target))
                self.gain_offsets.update({} if reason else {str(gain.target): offset})
                return reason
            if varies and self.per_channel(arg) is not None:  # a gain computed otherwise from a parameter (2·w)
                return "a per-channel gain computed from a parameter (only a stored gain, or c + w, is folded)"
        return None

    def _shift_breaks(self, node: fx.Node, tagged: list[fx.Node]) -> str | None:
        """A sum or difference: of tensors of the group, or of a parameter along its units (a bias: ``O b``);
        not of a constant along the units (``x + c``: ``O(x + c·1) ≠ Ox + c·1``)."""
        shape, tag = self.shape(node), self.tag(node)
        permuted = [] if tag is None else [a for a in tag.permuted if self._live(tag.at(a))]
        for arg in node.args:
            if isinstance(arg, int | float) and arg != 0 and permuted:
                return CENTRED + "a constant added to the units"
            s = self.shape(arg) if isinstance(arg, fx.Node) and arg not in tagged else None
            offset = None if s is None else len(shape) - len(s)
            if s is not None and any(a - offset < 0 or s[a - offset] == 1 for a in permuted):
                return CENTRED + "a tensor constant along the units added to them"
        return None

    def gained(self, node: fx.Node, gain: str) -> str | None:
        """A per-channel gain ``gain`` multiplies ``node``'s units: foldable when every use of ``node`` is a linear
        read (directly or through moves); then recorded with its readers, else a reason."""
        readers = self._linear_readers(node)
        if readers is None:
            return f"the gain {gain!r} in place (its output is read by more than linear layers)"
        self.gains.setdefault(gain, []).extend(r for r in readers if r not in self.gains.get(gain, []))
        return None

    def _linear_readers(self, node: fx.Node) -> list[str] | None:
        """The weights of the linear layers that read ``node`` along its last axis (directly or through copies and
        casts, which keep the axes where they are); None if anything else reads it."""
        readers = []
        for user in node.users:
            if user.target is getattr and len(user.args) > 1 and user.args[1] in METADATA:  # x.shape: no value read
                continue
            if user.op == "call_module" and isinstance(self.gm.get_submodule(str(user.target)), nn.Linear):
                readers.append(f"{user.target}.weight")
            elif user.op == "call_function" and user.target is F.linear and user.args[0] is node:
                w = user.args[1]
                if not (isinstance(w, fx.Node) and w.op == "get_attr"):
                    return None
                readers.append(str(w.target))
            elif user.target in ADDMM and user.args[1] is node and len(user.args) == 3:  # beta, alpha: still linear
                w = user.args[2]  # GPT-2's Conv1D: x @ W + b, W of shape (in, out), read along its rows
                if not (isinstance(w, fx.Node) and w.op == "get_attr") or len(set(self.shape(w) or ())) < 2:
                    return None  # a square W would leave the folding no way to tell its input axis
                readers.append(str(w.target))
            elif (
                user.target in COPYING
                or (user.op == "call_method" and user.target in COPYING_METHODS)
                or (user.op == "call_module" and isinstance(self.gm.get_submodule(str(user.target)), COPYING_MODULES))
                or (self._keeps_last_axis(node, user))
            ):
                found = self._linear_readers(user)
                if found is None:
                    return None
                readers += found
            else:
                return None
        return readers

    def _keeps_last_axis(self, node: fx.Node, user: fx.Node) -> bool:
        """``user`` picks or averages along other axes of ``node`` than its last (a class token, a mean over the
        tokens): a linear map that leaves the last axis, and its units, where they are."""
        last = len(self.shape(node) or ()) - 1  # the users' own tags are not known yet: read from the call
        if user.target is operator.getitem and user.args[0] is node and last > 0:
            index = user.args[1] if isinstance(user.args[1], tuple) else (user.args[1],)
            whole = all(i is not Ellipsis and i is not None for i in index)  # entries stand for the leading axes
            return whole and (len(index) <= last or index[last] == slice(None))
        if user.target is torch.reshape or user.target in ("view", "reshape"):
            shape_out = self.shape(user) or ()  # row-major: the same last length keeps the last axis whole
            return last > 0 and len(shape_out) > 0 and shape_out[-1] == self.shape(node)[-1]
        if user.target in (torch.mean, torch.sum) or user.target in ("mean", "sum"):
            dims = dim_of(user, 1)
            dims = (dims,) if isinstance(dims, int) else dims
            return bool(dims) and last > 0 and all(isinstance(d, int) and d % (last + 1) != last for d in dims)
        return False

    def _sums_square(self, node: fx.Node, square: fx.Node) -> bool:
        """``node`` sums or averages the square over every permuted axis it has (``‖x‖²``)."""
        reduce = node.target in (torch.mean, torch.sum) or METHODS.get(node.target) == "reduce"
        return reduce and self._reduces_units(node) and node.args[0] is square

    def _reduces_units(self, node: fx.Node) -> bool:
        """A mean or sum over a permuted axis of its input."""
        t_in, shape_in = self.tag(node.args[0]), self.shape(node.args[0])
        dims = dim_of(node, 1)
        dims = [d % len(shape_in) for d in ((dims,) if isinstance(dims, int) else dims or range(len(shape_in)))]
        return any(a in dims for a in t_in.permuted if self._live(t_in.at(a)))

    def _live(self, layout) -> bool:
        return any(isinstance(s, Seg) and self.groups.find(s.gid) != FIXED for s in layout)


def _stored(arg: fx.Node) -> fx.Node | None:
    """The parameter or buffer ``arg`` is, moved or cast at most (not computed from it: ``1 + w`` is no gain
    whose folding sets it to 1); None otherwise."""
    while arg.op != "get_attr":
        moving = arg.target in MOVING - {operator.getitem} or METHODS.get(arg.target) == "move"
        if not moving or not arg.args or not isinstance(arg.args[0], fx.Node):
            return None
        arg = arg.args[0]
    return arg


def _offset_gain(arg: fx.Node) -> tuple[float, fx.Node] | None:
    """``(c, w)`` when ``arg`` is a number ``c`` plus a stored gain ``w`` (Gemma's ``1 + w``), cast at most:
    folded as the gain ``c + w``, after which ``w = 1 − c``; None otherwise."""
    while arg.target in COPYING or (arg.op == "call_method" and arg.target in COPYING_METHODS):
        if not arg.args or not isinstance(arg.args[0], fx.Node):
            return None
        arg = arg.args[0]
    if not (arg.target in (operator.add, torch.add) or arg.target == "add") or len(arg.args) != 2 or arg.kwargs:
        return None  # torch.add's alpha scales the second term: no c + w
    numbers = [a for a in arg.args if isinstance(a, int | float) and not isinstance(a, bool)]
    nodes = [a for a in arg.args if isinstance(a, fx.Node)]
    stored = _stored(nodes[0]) if len(numbers) == 1 and len(nodes) == 1 else None
    return None if stored is None else (float(numbers[0]), stored)


def _is_square(node: fx.Node) -> bool:
    """``x.pow(2)``, ``x ** 2`` or ``x * x``."""
    args = node.args
    if node.target in (torch.pow, operator.pow, torch.ops.aten.pow.Tensor_Scalar) or node.target == "pow":
        return (args[1] if len(args) > 1 else node.kwargs.get("exponent")) == 2  # x.pow(exponent=2) too
    mul = node.target in (operator.mul, torch.mul, "mul", "__mul__")
    return mul and len(args) == 2 and args[0] is args[1]


def _conv_groups(node: fx.Node) -> int:
    groups = node.args[6] if len(node.args) > 6 else node.kwargs.get("groups", 1)
    return groups if isinstance(groups, int) else 0
