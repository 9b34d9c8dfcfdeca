"""The rules of :mod:`lmclab.trace` for multi-head attention. Mixed into
:class:`lmclab.trace.graph.GraphTracer`.

A reshape of an axis holding one group's ``E`` units into ``(H, d)`` marks that group *headed*
(:class:`lmclab.core.heads.Heads`): its permutations are ``perm[h·d + j] = σ[h]·d + τ_h[j]``. The new
head axis is permuted by σ alone — a segment of the group's *tie*, an element of the union-find that no
parameter may carry — and the feature axis by ``τ_h`` of the head ``h`` it sits at (:class:`Within`).

- ``q @ kᵀ`` contracts the features of two heads at the same head (a batch axis): the two groups are
  one (``Σ_j q_j k_j`` is unchanged by one τ_h on both); the logits keep only the head order σ;
- ``weights @ v`` shares σ between the logits' head axis and ``v``'s: the groups of ``v`` and of ``q``/``k``
  are *tied*; the result carries ``v``'s group;
- softmax over any axis is equivariant, except across heads when a tensor also holds per-head
  features (the normaliser would mix features τ_h moves differently);
- joining ``(H, d)`` back into ``E`` (reshape, flatten) gives the headed group's plain units;
- ``nn.MultiheadAttention`` is a leaf (``torch.fx`` keeps ``torch.nn`` modules whole): ``in_proj_weight``'s
  rows are three segments Q, K, V of ``E`` each (Q and K one headed group, V another, tied), its columns
  take the layout of the input; ``out_proj`` reads V's group and writes a new group.

Anything else touching a head axis or per-head features (a Linear or norm over them, a mean, a
parameter varying along them, a head count that differs) is refused.
"""

from __future__ import annotations

import operator

import torch
from torch import fx, nn

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
from lmclab.trace.state import TraceState, dim_of

# what may touch a head axis or per-head features: elementwise ops, moves, reshapes, products, softmax, x.shape
HEADED_FUNCTIONS = MERGE_FUNCTIONS | SOFTMAX_FUNCTIONS | MATMUL_FUNCTIONS | (CARRY_FUNCTIONS - POOL_FUNCTIONS)
HEADED_FUNCTIONS |= {operator.getitem, getattr, torch.transpose, torch.permute, torch.swapaxes, torch.reshape}
HEADED_FUNCTIONS |= {torch.cat, torch.ops.aten.expand.default}
HEADED_METHODS = {"add", "add_", "mul", "mul_", "__add__", "__mul__", "div", "sub", "contiguous", "clone", "size"}
HEADED_METHODS |= {"dim", "transpose", "permute", "swapaxes", "view", "reshape", "flatten", "softmax", "expand"}


class AttentionRules(TraceState):
    """Reads and writes the tracer's state (:class:`~lmclab.trace.state.TraceState`); also calls the tracer's
    ``unite`` and ``record``."""

    def is_headed(self, seg: Seg | Within) -> bool:
        """A segment of a head order σ, or per-head features."""
        return isinstance(seg, Within) or self.groups.find(seg.gid) in self.groups.ties

    def headed_axes(self, tag: Tag | None) -> list[int]:
        return [] if tag is None else [a for a in self.live(tag) if any(map(self.is_headed, tag.at(a)))]

    def knows_heads(self, node: fx.Node, tags: list[Tag | None], module: nn.Module | None = None) -> bool:
        """False when a head axis or per-head features reach a node no rule of this module covers: a module
        other than an activation, or a Linear or LayerNorm over them; a function not in the tables above."""
        heads = [a for t in tags for a in self.headed_axes(t)]
        if not heads:
            return True
        if module is not None:
            over = len(self.shape(node)) - 1 in heads
            return (
                isinstance(module, (nn.Linear, *LAST_AXIS_NORMS))
                and not over
                or isinstance(module, nn.Softmax)  # its rule checks the axis (softmax)
                or (isinstance(module, CARRY_MODULES) and not isinstance(module, POOL_MODULES))
            )
        targets = (torch.flatten, *HEADED_FUNCTIONS, *loaded_carry_functions())
        return node.target in targets or node.target in HEADED_METHODS

    def well_formed(self, tag: Tag) -> bool:
        """Every axis of per-head features has exactly one axis of its heads beside it."""
        ties = [  # a head order coarsened to blocks (grouped queries) is the coarse order
            self.groups.resolve(s).gid if isinstance(s, Seg) else self.groups.find(s.gid)
            for a in self.live(tag)
            for s in tag.at(a)
            if self.is_headed(s)
        ]
        return all(
            ties.count(tie) == 1
            for a in self.live(tag)
            for s in tag.at(a)
            if isinstance(s, Within) and (tie := self.groups.tie_of(s.gid)) not in (None, FIXED)
        )

    def split_heads(self, node: fx.Node, t_in: Tag, axis: int, count: int, d: int) -> bool:
        """``(…, E, …) -> (…, H, d, …)`` of one plain group: the group becomes headed (False: the axis is not
        one group's units)."""
        lay = t_in.at(axis)
        seg = self.groups.resolve(lay[0]) if len(lay) == 1 and isinstance(lay[0], Seg) else None
        if seg is None or seg.block != 1 or self.is_headed(seg):
            return False
        known = self.groups.heads.get(seg.gid)
        if known is not None and known[0] != count:
            self.refuse(node, f"a split into {count} heads of a group split into {known[0]} heads elsewhere")
            return True
        tie = self.groups.headed(seg.gid, count, d)
        lays = t_in.layouts
        self.tags[node] = Tag.of(lays[:axis] + ((Seg(tie, count),), (Within(seg.gid, d),)) + lays[axis + 1 :])
        return True

    def joined_heads(self, lays: tuple[Layout, ...], inside: list[int], start: int, end: int) -> Layout:
        """The layout of ``(H, d)`` flattened into ``E``: the headed group's units (None: not a head axis
        followed by the features of its own heads)."""
        if inside != [start, start + 1] or end != start + 1 or len(lays[start]) != 1 or len(lays[end]) != 1:
            return None
        head, within = lays[start][0], lays[end][0]
        if not isinstance(within, Within):
            return None
        if self.groups.tie_of(within.gid) != self.groups.find(head.gid):
            return self.joined_repeated(head, within)
        return (Seg(within.gid, head.length * within.length),)

    def softmax(self, node: fx.Node, t_in: Tag, dim: int | None = None) -> None:
        """``softmax(x, dim)`` (``dim``: an ``nn.Softmax``'s; else the call's)."""
        if dim is None:
            dim = dim_of(node, 1)
        heads = self.headed_axes(t_in)
        if dim is None or (
            dim % len(self.shape(node)) in heads and any(isinstance(t_in.at(a)[0], Within) for a in heads)
        ):
            return self.refuse(node, "a softmax across heads whose features are permuted per head")
        self.carry(node, t_in)

    def matmul(self, node: fx.Node) -> None:
        """``A @ B``: batch axes broadcast and merge (as ``+``), ``A``'s last axis and ``B``'s second-last
        are contracted (permuted alike, or both pinned), the result keeps ``A``'s rows and ``B``'s columns.
        (A product over a head axis leaves the features of those heads without it: refused by ``well_formed``.)"""
        a, b = node.args[:2]
        shape = self.shape(node)
        if not all(isinstance(x, fx.Node) and len(self.shape(x) or ()) >= 2 for x in (a, b)):
            return self.refuse(node, "a product with a vector")
        ta, tb = self.tag(a), self.tag(b)
        ca, cb = (ta.at(-1) if ta else None), (tb.at(-2) if tb else None)
        if ca is not None and cb is not None:
            if not self.unite(ca, cb):
                return self.refuse(node, "a product over an axis its operands permute differently")
            if isinstance(ca[0], Within) and not self.is_rigid(ca[0]) and not self.same_heads(node, a, b, ca[0].gid):
                return self.refuse(node, "a product over the features of heads that are not one batch axis")
        elif ca is not None or cb is not None:
            self.fix(ca or cb)
        out: list[Layout] = []
        for axis in range(len(shape) - 2):
            here = [(x, lay) for x in (a, b) if (lay := self.broadcast(x, axis, len(shape))) is not None]
            if here and not all(self.unite(here[0][1], lay) for _, lay in here[1:]):
                return self.refuse(node, "its operands are permuted differently on a batch axis")
            varying = [
                x for x in (a, b) if self.broadcast(x, axis, len(shape)) is None and self.size(x, axis, shape) > 1
            ]
            if here and varying:
                self.pin([s.gid for s in here[0][1]])
            out.append(here[0][1] if here else None)
        self.tags[node] = Tag.of(out + [ta.at(-2) if ta else None, tb.at(-1) if tb else None])

    def same_heads(self, node: fx.Node, a: fx.Node, b: fx.Node, gid: int) -> bool:
        """Contracting per-head features is ``Σ_j q_j k_j`` only within one head: both operands' head axis
        (of ``gid``'s tie) must be one batch axis of the product (a pinned head order: anything goes)."""
        tie, ndim = self.groups.tie_of(gid), len(self.shape(node))
        if tie in (None, FIXED):
            return True
        ties = {tie} | {self.groups.tie_of(g) for g in self.copied_with(gid)}  # query heads over key heads
        at = [
            {k + ndim - len(t.layouts) for k in self.live(t) if self.groups.find(t.at(k)[0].gid) in ties}
            for t in (self.tag(a), self.tag(b))
        ]
        return at[0] == at[1] and len(at[0]) == 1 and min(at[0]) < ndim - 2

    def copied_with(self, gid: int) -> list[int]:
        """The groups read as copies of ``gid``'s group, or that it is read as copies of (grouped queries)."""
        root, copies = self.groups.find(gid), self.groups.copies
        return [base for r, (base, _, _) in copies.items() if r == root] + [
            r for r, (base, _, _) in copies.items() if self.groups.find(base) == root
        ]

    def size(self, arg: fx.Node, axis: int, shape: tuple[int, ...]) -> int:
        """The length of ``arg`` on batch ``axis`` of a product of shape ``shape`` (1 if broadcast)."""
        k = axis - (len(shape) - len(self.shape(arg)))
        return self.shape(arg)[k] if k >= 0 else 1

    def attention(self, node: fx.Node, name: str, module: nn.MultiheadAttention) -> None:
        """``nn.MultiheadAttention`` as a leaf (module docstring); its output is the tuple
        ``(attn_output, weights)``, read by :meth:`attention_item`."""
        if not module._qkv_same_embed_dim or module.bias_k is not None or module.add_zero_attn:
            return self.refuse(node, "a MultiheadAttention with separate q/k/v projections or extra keys")
        inputs = [
            node.args[i] if i < len(node.args) else node.kwargs.get(k) for i, k in enumerate(("query", "key", "value"))
        ]
        if any(self.tag(x) for x in node.all_input_nodes if x not in inputs):
            return self.refuse(node, "an attention mask that is permuted")
        tags = [self.tag(x) for x in inputs]
        if any(t is not None and set(self.live(t)) - {len(t.layouts) - 1} for t in tags):
            return self.refuse(node, "an attention over permuted tokens or samples")
        lays = [t.at(-1) for t in tags if t is not None]
        if len(lays) < 3:
            self.pin([s.gid for lay in lays for s in lay])
        elif not all(self.unite(lays[0], lay) for lay in lays[1:]):
            return self.refuse(node, "its query, key and value are permuted differently")
        e, count = module.embed_dim, module.num_heads
        qk, vo, written = self.groups.new(), self.groups.new(), self.groups.new()
        tie = self.groups.union(self.groups.headed(qk, count, e // count), self.groups.headed(vo, count, e // count))
        rows = (Seg(qk, e), Seg(qk, e), Seg(vo, e))
        self.record(f"{name}.in_proj_weight", [rows, lays[0] if len(lays) == 3 else None])
        self.record(f"{name}.out_proj.weight", [(Seg(written, e),), (Seg(vo, e),)])
        if module.in_proj_bias is not None:
            self.record(f"{name}.in_proj_bias", [rows])
            self.record(f"{name}.out_proj.bias", [(Seg(written, e),)])
        ndim = len(self.shape(inputs[0]))
        self.tags[node] = Tag.of((None,) * (ndim - 1) + ((Seg(written, e),),))
        self.attention_heads[node] = (tie, count, ndim)

    def attention_item(self, node: fx.Node, source: fx.Node) -> None:
        """``(attn_output, weights)[i]``: the output's tag; weights averaged over heads are unpermuted,
        per-head weights ``(…, H, L, S)`` are permuted by the head order."""
        tie, count, ndim = self.attention_heads[source]
        shape = self.shape(node)
        if node.args[1] == 0:
            self.tags[node] = self.tags[source]
        elif shape is None or len(shape) == ndim:
            self.tags[node] = None
        else:
            self.tags[node] = Tag.of([(Seg(tie, count),) if a == len(shape) - 3 else None for a in range(len(shape))])
