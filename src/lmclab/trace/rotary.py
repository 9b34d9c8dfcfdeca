"""The rules of :mod:`lmclab.trace` for rotary embeddings and grouped-query attention (Llama, Mistral).
Mixed into :class:`lmclab.trace.graph.GraphTracer`.

**Rotary embeddings.** ``q' = q·cos + rotate_half(q)·sin`` rotates the pair of features ``(j, j + d/2)`` of
each head by the angle ``θ_j·t`` at position ``t``, with ``θ_j = base^(−2j/d)`` distinct for every ``j``.
Then ``q'·k' = Σ_j Re(q̃_j k̃_j* e^{iθ_j(t_q − t_k)})``: moving a feature to another place inside the head
changes the angle its pair turns by (or, swapping the two halves of a pair, its sign), so the only
permutations of a head's query and key features that keep the function are the identity: the heads move
as whole blocks (σ), their features stay in place. The tracer derives this from the graph: a per-head
feature axis multiplied by a tensor varying along it (``cos``, ``sin``), sliced (``x[..., :d/2]``) or read
by position makes its group *rigid* (:meth:`lmclab.trace.groups.Groups.make_rigid`): coarsened to runs of
one head, one unit per head, ordered by the heads' tie. Values are not rotated: their τ stay free. Under
``symmetry="orthogonal"`` :mod:`lmclab.trace.planes` (the base of these rules) proves from the same graph the
larger symmetry inside such heads, one rotation per plane, and leaves the group free where it can.

**Grouped-query attention.** ``H`` query heads share ``K < H`` key/value heads, query head ``h`` reading
key/value head ``h // (H/K)``: ``repeat_kv`` expands ``(B, K, T, d)`` to ``(B, K, H/K, T, d)`` and flattens
it to ``(B, H, T, d)``. A head order flattened with unpermuted axes after it moves in blocks: the keys'
order σ on ``K`` heads is the query heads' order in blocks of ``H/K`` (``unite`` coarsens the query
heads' tie to those blocks). So key/value head ``g`` takes its group of ``H/K`` query heads along, in
order; the features of a query head and of the key head it reads are contracted in place (rigid), and the
output projection reads the value heads' features repeated per query head, which only whole heads can
keep: the value group is made rigid too. Permuting query heads inside a group, or value features inside
a head, are further symmetries no :class:`~lmclab.core.heads.Heads` can say; they are left alone.

Under ``symmetry="orthogonal"`` the heads' insides are kept instead (Theus et al. 2025, Section 3): ``q_h·k_g``
(``g = h // n``, ``n = H/K``) is kept by one map ``R_g`` of key head ``g``'s features applied to the features of
each of its ``n`` query heads too, and ``W_O`` reads value head ``g`` once per query head, so one ``R_g`` of its
values acts on those ``n`` copies of W_O's columns alike. The query group and the joined output are then no groups
of their own: their units are the key (value) group's, in ``n`` copies of one head each
(:attr:`lmclab.trace.groups.Groups.copies`; :class:`lmclab.core.segments.Segment`'s ``copies``). This holds when
query head ``h`` reads key head ``h // n``, which the heads' orders prove at the end (the query heads' order is the
key heads' in blocks of ``n``, :meth:`settle_copies`); whatever bends or pins the queries bends or pins the keys.
"""

from __future__ import annotations

import math

from torch import fx

from lmclab.trace.groups import FIXED, Layout, Seg, Tag, Within
from lmclab.trace.planes import PlaneRules


class RotaryRules(PlaneRules):
    """Reads and writes the tracer's state (:class:`~lmclab.trace.state.TraceState`) alone."""

    def is_rigid(self, seg: Seg | Within) -> bool:
        return isinstance(seg, Within) and self.groups.find(seg.gid) in self.groups.rigid

    def fix(self, layout: Layout) -> None:
        """``layout`` read in place: a per-head feature axis makes its group rigid, anything else is pinned."""
        for seg in layout or ():
            tie = self.groups.tie_of(seg.gid) if isinstance(seg, Within) else None
            if tie not in (None, FIXED):
                self.groups.make_rigid(seg.gid)
            else:
                self.pin([seg.gid])

    def unite_within(self, a: Layout, b: Layout) -> bool:
        """Two per-head feature axes: of one group (τ shared), or — rigid, or heads of different counts
        (grouped queries) — both kept in place."""
        if not (len(a) == len(b) == 1 and a[0].length == b[0].length):
            return False
        if type(a[0]) is not type(b[0]):  # one key head (multi-query) is no head axis: both read in place
            self.fix(a + b)
            return True
        ga, gb = a[0].gid, b[0].gid
        counts = {
            self.groups.heads[self.groups.find(g)][0] for g in (ga, gb) if self.groups.find(g) in self.groups.heads
        }
        if len(counts) > 1 and self.copied(a[0], b[0]):
            return True
        if len(counts) > 1 or self.is_rigid(a[0]) or self.is_rigid(b[0]):
            self.fix(a + b)
            return True
        return a[0].length == b[0].length and self.groups.joinable(ga, gb) and self.groups.union(ga, gb) is not None

    def repeated_heads(self, node: fx.Node, lays: tuple[Layout, ...], start: int, end: int) -> bool:
        """A head order flattened with unpermuted axes after it (``repeat_kv``): the order in blocks."""
        shape_in = self.shape(node.args[0])
        if not all(lays[a] is None for a in range(start + 1, end + 1)) or any(
            isinstance(s, Within) for s in lays[start]
        ):
            return False
        factor = math.prod(shape_in[start + 1 : end + 1])
        merged = tuple(Seg(s.gid, s.length * factor, s.block * factor) for s in lays[start])
        self.tags[node] = Tag.of(lays[:start] + (merged,) + lays[end + 1 :])
        return True

    def joined_repeated(self, head: Seg, within: Within) -> Layout:
        """``(H, d)`` joined when the head axis is a coarsened order (query heads over repeated value
        heads): the value group made rigid, each of its heads in a block of ``H/K·d`` features (None: not
        the features of these heads)."""
        order = self.groups.resolve(head)
        tie = self.groups.tie_of(within.gid)
        if tie in (None, FIXED) or order.gid != tie or order.block == 1:
            return None
        if self.symmetry == "orthogonal" and not self.is_rigid(within):  # each value head's features, n times
            joined = self.groups.new()
            self.groups.copies[joined] = (within.gid, order.block, within.length)
            return (Seg(joined, head.length * within.length),)
        self.groups.make_rigid(within.gid)
        coarse = self.groups.coarse[self.groups.find(within.gid)][0]
        return (Seg(coarse, head.length * within.length, order.block * within.length),)

    def copied(self, a: Within, b: Within) -> bool:
        """Under ``symmetry="orthogonal"``, the per-head features of ``H`` query heads contracted with those of
        ``K`` key heads (``K`` divides ``H``): the query group's units are the key group's, once per query head
        (module docstring); False when they are not two free headed groups of such counts."""
        roots = [self.groups.find(x.gid) for x in (a, b)]
        if self.symmetry != "orthogonal" or FIXED in roots or self.is_rigid(a) or self.is_rigid(b):
            return False
        if any(r not in self.groups.heads or r in self.groups.copies for r in roots):
            return False
        (many, h_many), (few, h_few) = sorted(((r, self.groups.heads[r][0]) for r in roots), key=lambda p: -p[1])
        if h_many % h_few:
            return False
        self.groups.copies[many] = (few, h_many // h_few, a.length)
        return True

    def settle_copies(self) -> None:
        """Each group read as copies of another (module docstring) holds if its heads' order is the other's in
        blocks of ``n`` — else both are read in place, as under ``symmetry="permutation"`` — and carries what
        bends it or turns it per plane to the other."""
        find, bent = self.groups.find, {self.groups.find(g): why for g, why in self.bent.items()}
        planes = {find(g): why for g, why in self.planes.items()}
        for root, (base, copies, _) in list(self.groups.copies.items()):
            if root not in self.groups.heads:  # a joined output (its order: the value heads' by construction)
                continue
            count, tie = self.groups.heads[root]
            order, base_tie = self.groups.resolve(Seg(tie, count)), self.groups.tie_of(base)
            if order.gid != base_tie or order.block != copies:
                del self.groups.copies[root]
                self.fix((Within(root, 1), Within(base, 1)))
                continue
            if root in self.groups.rigid:
                self.groups.make_rigid(base)
            for found, into in ((bent, self.bent), (planes, self.planes)):
                if root in found:
                    into.setdefault(find(base), found[root])

    def settle_rigid(self) -> None:
        """A rigid group (one unit per head) whose heads' order was coarsened to blocks (grouped queries)
        is coarsened alike: one unit per block, ordered by the coarse order (after :meth:`settle_planes`)."""
        self.settle_copies()
        self.settle_planes()
        for root, (count, tie) in list(self.groups.heads.items()):
            order = self.groups.resolve(Seg(tie, count))
            if self.groups.find(root) != root or order.block == 1 or order.gid == FIXED or root in self.groups.copies:
                continue
            if root in self.groups.rigid:  # the fine group: its coarse one carries the heads
                continue
            if self.groups.head_sizes.get(root) is None and any(root == c for c, _ in self.groups.coarse.values()):
                coarse = self.groups.coarsen(root, order.block)
                self.groups.heads.setdefault(self.groups.find(coarse), (count // order.block, order.gid))
            else:  # per-head features under an order in blocks: no Heads can say it
                self.pin([root])
