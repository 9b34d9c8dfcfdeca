"""The log of pins the tracer keeps beside its union-find (:class:`lmclab.trace.groups.Groups`): which
element was pinned by which graph node and why, and the union-find as it would be with nothing pinned,
whose classes are the *streams* (every element that would share one permutation), so that each unit left
unpermuted can be traced back to the first pin of its stream (:mod:`lmclab.trace.pinned`)."""

from __future__ import annotations

from collections.abc import Callable

FIXED = -1  # the union-find root of every group that must not be permuted
Cause = tuple[str, str, str]  # (graph node, module path, reason)


class PinLog:
    """The pins made so far, each with the :attr:`cause` current when it was made."""

    def __init__(self) -> None:
        self.unpinned: dict[int, int] = {}  # the union-find with nothing pinned (FIXED kept apart)
        self.pins: list[tuple[int, Cause | None]] = []  # (element, its cause), in order
        self.cause: Cause | None = None  # set by the tracer for the node it reads (None: the output)
        self.outputs: set[int] = set()  # elements the model's output holds

    def stream(self, gid: int) -> int:
        """The root of ``gid`` in :attr:`unpinned`: every element it would share a permutation with."""
        while (up := self.unpinned.setdefault(gid, gid)) != gid:
            self.unpinned[gid] = self.unpinned.setdefault(up, up)  # path halving
            gid = up
        return gid

    def logged(self, a: int, b: int, find: Callable[[int], int]) -> None:
        """Before ``union(a, b)``: a pin of the other element when one is FIXED (unless already pinned), else
        one stream."""
        if FIXED not in (a, b):
            return self.join(a, b)
        other = a + b - FIXED
        if self.cause is None:  # the model's output, pinned or not before: its streams are never permuted
            self.outputs.add(other)
        if find(other) != FIXED:
            self.pins.append((other, self.cause))

    def join(self, a: int, b: int) -> None:
        """``a`` and ``b`` are one stream (the tracer unites them, perhaps through their roots: FIXED)."""
        if FIXED not in (a, b):
            self.unpinned[self.stream(a)] = self.stream(b)

    def first_causes(self) -> dict[int, Cause | None]:
        """Per stream, the cause of its first pin (None: the model's output holds it)."""
        first: dict[int, Cause | None] = {self.stream(g): None for g in self.outputs}
        for g, cause in self.pins:
            first.setdefault(self.stream(g), cause)
        return first
