"""The rules of :mod:`lmclab.trace` for packed projections and fused attention: timm's ``Attention``
(``qkv = Linear(E, 3E)``, ``qkv(x).reshape(B, N, 3, H, d).permute(2, 0, 3, 1, 4).unbind(0)``, then
``F.scaled_dot_product_attention(q, k, v)`` or its unfused form). Mixed into
:class:`lmclab.trace.graph.GraphTracer`.

- A reshape of one group's ``P·E`` units into ``(P, H, d)`` *refines* the group into ``P`` groups of
  ``E = H·d`` units (the *parts*: Q, K, V), each split into ``H`` heads of ``d``: every axis that held
  the group (the Linear's rows and bias, its activation point) now holds the parts side by side, one
  segment each. Each part starts as a headed group with a head order of its own; attention makes them
  one or ties them (:mod:`lmclab.trace.attention`), exactly as for separate q/k/v Linears.
- The part axis is *packed*: a tensor holding it is followed only through moves (``permute``,
  ``transpose``), ``unbind`` along the part axis and an int index on it (``qkv[0]``), which give part
  ``i`` as a headed tensor of its own. Anything else on a packed tensor is refused (and, with
  ``partial=True``, leaves every part unpermuted).
- ``F.scaled_dot_product_attention(q, k, v)`` is ``softmax(q kᵀ·s + mask) v``: the two products of the
  unfused form. ``q``'s and ``k``'s features are contracted within one head (one group), the batch and
  head axes of ``q``, ``k`` and ``v`` are one (tying ``v``'s head order to theirs), the token axes stay
  unpermuted, the output carries ``v``'s features. A mask varying along the head axis (Hugging Face Swin's
  relative position bias, passed as the mask) fixes the head order, as an added bias does in the unfused
  form; so does a mask permuted by a group of its own (T5's relative attention bias, an embedding whose
  columns are the heads), which is pinned: read in place. A mask permuted by a head order or per-head
  features, and grouped-query attention, are refused.
"""

from __future__ import annotations

import operator

import torch
from torch import fx

from lmclab.trace.groups import FIXED, Layout, Seg, Tag, Within
from lmclab.trace.shapes import _axis_order
from lmclab.trace.state import TraceState, dim_of

SDPA = torch.nn.functional.scaled_dot_product_attention
MOVES = {torch.transpose, torch.permute, torch.swapaxes}
SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


class PackedRules(TraceState):
    """Reads and writes the tracer's state (:class:`~lmclab.trace.state.TraceState`); also calls the tracer's
    ``unite``, ``same_heads`` and ``broadcast``."""

    def split_packed(self, node: fx.Node, t_in: Tag, axis: int, parts: int, count: int, d: int) -> bool:
        """``(…, P·E, …) -> (…, P, H, d, …)``: the group on ``axis`` refined into ``parts`` headed groups
        (False: the axis holds neither one group's units nor ``parts`` groups of ``E`` units)."""
        lay = tuple(map(self.groups.resolve, t_in.at(axis)))
        if len(lay) == 1 and lay[0].block == 1 and not self.is_headed(lay[0]) and lay[0].gid not in self.groups.heads:
            gids = self.refine(lay[0].gid, parts)
        elif len(lay) == parts and all(s.block == 1 and s.length == count * d for s in lay):
            gids = [s.gid for s in lay]
        else:
            return False
        lays = self.tags[node.args[0]].layouts  # (refined)
        per_part = []
        for gid in gids:
            if self.groups.find(gid) == FIXED:
                inner: tuple[Layout, Layout] = (None, None)
            else:
                inner = ((Seg(self.groups.headed(gid, count, d), count),), (Within(gid, d),))
            per_part.append(Tag.of(lays[:axis] + (None, *inner) + lays[axis + 1 :]))
        self.tags[node] = None
        self.packed[node] = (axis, per_part)
        return True

    def refine(self, gid: int, parts: int) -> list[int]:
        """Replace the group of ``gid`` by ``parts`` new groups side by side on every axis that holds it."""
        root, new = self.groups.find(gid), [self.groups.new() for _ in range(parts)]
        if root in self.groups.copies:  # a key/value head's features read per query head: no pieces of their own
            root = self.groups.refused(root, "a split of features read once per query head (grouped queries)")
        if root == FIXED:
            for g in new:
                self.groups.union(g, FIXED)
            return new

        def split(lay: Layout) -> Layout:
            if lay is None:
                return None
            out: list[Seg | Within] = []
            for s in lay:
                whole = isinstance(s, Seg) and self.groups.find(s.gid) == root
                out += [Seg(g, s.length // parts, s.block) for g in new] if whole else [s]
            return tuple(out)

        self.axes = {k: [split(lay) for lay in lays] for k, lays in self.axes.items()}
        self.tags = {n: t and Tag(tuple(map(split, t.layouts))) for n, t in self.tags.items()}
        self.packed = {
            n: (a, [t and Tag(tuple(map(split, t.layouts))) for t in ts]) for n, (a, ts) in self.packed.items()
        }
        points = [p for g in list(self.writers) if self.groups.find(g) == root for p in self.writers.pop(g)]
        for i, g in enumerate(new):  # part i of each point: ``module@axis[i/parts]``
            self.writers[g] = [(kind, f"{point}[{i}/{parts}]") for kind, point in points]
        return new

    def packed_gids(self, node: fx.Node) -> list[int]:
        tags = self.packed[node][1] if node in self.packed else self.unbound.get(node, [])
        return [g for t in tags if t is not None for g in t.gids]

    def on_packed(self, node: fx.Node) -> None:
        """A node reading a packed tensor (or the parts ``unbind`` gave): a move, the unbind, a part."""
        source = node.args[0] if node.args else None
        method = node.target if node.op == "call_method" else None
        if source in self.unbound and node.target is operator.getitem and isinstance(node.args[1], int):
            self.tags[node] = self.unbound[source][node.args[1]]
        elif source in self.packed and (method in ("permute", "transpose", "swapaxes") or node.target in MOVES):
            self.move_packed(node, source)
        elif source in self.packed and (method == "unbind" or node.target is torch.unbind):
            dim = dim_of(node, 1, 0)
            axis, tags = self.packed[source]
            if dim % len(self.shape(source)) != axis:
                return self.refuse_packed(node, "an unbind along an axis that is not the packed part axis")
            self.unbound[node] = [t and Tag.of(t.layouts[:axis] + t.layouts[axis + 1 :]) for t in tags]
            self.tags[node] = None
        elif source in self.packed and node.target is operator.getitem and (part := self.part(node)) is not None:
            self.tags[node] = part
        else:
            self.refuse_packed(node, self.packed_reason(node))

    def move_packed(self, node: fx.Node, source: fx.Node) -> None:
        axis, tags = self.packed[source]
        order = _axis_order(node, len(self.shape(node)))
        self.packed[node] = (order.index(axis), [t and Tag.of([t.at(a) for a in order]) for t in tags])
        self.tags[node] = None

    def part(self, node: fx.Node) -> Tag | None:
        """``x[i]`` or ``x[:, i]`` with the int on the part axis and full slices before it: part ``i``."""
        axis, tags = self.packed[node.args[0]]
        items = node.args[1] if isinstance(node.args[1], tuple) else (node.args[1],)
        if len(items) != axis + 1 or not isinstance(items[axis], int) or any(i != slice(None) for i in items[:axis]):
            return None
        t = tags[items[axis]]
        return t and Tag.of(t.layouts[:axis] + t.layouts[axis + 1 :])

    def refuse_packed(self, node: fx.Node, reason: str) -> None:
        """Refused: with ``partial=True`` every part reaching ``node`` stays unpermuted."""
        self.pin([g for a in node.all_input_nodes for g in self.packed_gids(a)], reason)
        self.refuse(node, reason)

    def fused_attention(self, node: fx.Node) -> None:
        """``F.scaled_dot_product_attention``: the two products of ``softmax(q kᵀ·s + mask) v`` (module docstring)."""
        args = dict(zip(SDPA_ARGS, node.args, strict=False)) | node.kwargs
        q, k, v = (args[key] for key in SDPA_ARGS[:3])
        if args.get("enable_gqa"):
            return self.refuse(node, "grouped-query attention (keys shared by several query heads)")
        mask = args.get("attn_mask") if isinstance(args.get("attn_mask"), fx.Node) else None
        mask = mask if mask is not None and self.shape(mask) is not None else None  # a mask of None: no node
        if (t_mask := self.tag(mask)) is not None:  # a bias table's own group over the heads (T5): read in place
            if any(self.is_headed(s) for a in self.live(t_mask) for s in t_mask.at(a)):
                return self.refuse(node, "an attention mask that is permuted")
            self.pin(t_mask.gids)
        tags, shape = [self.tag(x) for x in (q, k, v)], self.shape(node)
        ndim = len(shape)
        if any(t is not None and len(self.shape(x)) - 2 in self.live(t) for x, t in zip((q, k, v), tags, strict=True)):
            return self.refuse(node, "an attention over permuted tokens")
        cq, ck = (t.at(-1) if t else None for t in tags[:2])
        if cq is not None and ck is not None:
            if not self.unite(cq, ck):
                return self.refuse(node, "a product over an axis its operands permute differently")
            if isinstance(cq[0], Within) and not self.is_rigid(cq[0]) and not self.same_heads(node, q, k, cq[0].gid):
                return self.refuse(node, "a product over the features of heads that are not one batch axis")
        elif cq is not None or ck is not None:
            self.fix(cq or ck)
        out: list[Layout] = []
        for axis in range(ndim - 2):
            here = [lay for x in (q, k, v) if (lay := self.broadcast(x, axis, ndim)) is not None]
            if here and not all(self.unite(here[0], lay) for lay in here[1:]):
                return self.refuse(node, "its query, key and value are permuted differently on a batch axis")
            varying = [x for x in (q, k, v) if self.broadcast(x, axis, ndim) is None and self.size(x, axis, shape) > 1]
            varying += [mask] if mask is not None and self.size(mask, axis, shape) > 1 else []
            if (
                here and varying
            ):  # an unpermuted operand or mask (a bias per head) varying along the axis fixes its order
                self.pin([s.gid for s in here[0]])
            out.append(here[0] if here else None)
        self.tags[node] = Tag.of(out + [None, tags[2].at(-1) if tags[2] else None])
