"""What a trace leaves unpermuted, and why: :attr:`lmclab.core.spec.PermutationSpec.pinned`.

A traced spec is a subgroup of the model's symmetries: units the tracer cannot prove permutable are
*pinned* (left unpermuted) — combined with a tensor that varies along them unpermuted (the model's input, or
a value not computed from the model's parameters), read by position, or reaching a node refused under
``partial=True``. A pin pins the whole *stream* it meets: every unit that would share its permutation (a
residual stream, written by every block). Each pin is logged with its graph node, module path and reason
(:mod:`lmclab.trace.pins`); the spec's ``pinned`` lists, per cause, the units left unpermuted and the
tensor axes they sit on. The model's own inputs and outputs are never permuted and are not listed.

:func:`pinned_message` says it in one line when a stream (units two or more layers write) or more than
:data:`PINNED_SHARE` of the parameters (their values, running statistics left out) lie on a pinned axis;
:func:`lmclab.find_permutation` warns with it (:class:`PinnedWarning`), ``lmclab match`` prints it.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping

from torch import Tensor, fx

from lmclab.core.callers import caller_level
from lmclab.core.spec import PermutationSpec, Pinned
from lmclab.trace.groups import FIXED, Seg
from lmclab.trace.pins import Cause
from lmclab.trace.state import TraceState, _where

PINNED_SHARE = 0.1  # of the parameters' values on a pinned axis: beyond it, a warning
READ_IN_PLACE = "read in place: by position, or beside a tensor not permuted alike"
COMBINED = "combined with a tensor varying along it, not permuted alike (the model's input, or not its parameter)"


class PinnedWarning(UserWarning):
    """A traced spec leaves a residual stream, or more than :data:`PINNED_SHARE` of the parameters, unpermuted."""


class PinnedRules(TraceState):
    """Reads the tracer's state (:class:`~lmclab.trace.state.TraceState`) alone."""

    def cause_at(self, node: fx.Node, reason: str = READ_IN_PLACE) -> Cause | None:
        """The cause of the pins ``node`` makes (None: the model's output, which is never permuted)."""
        return None if node.op == "output" else (node.name, _where(node), reason)

    def cause_of(self, gid: int, first: Mapping[int, Cause | None]) -> Cause | None:
        """The first pin of ``gid``'s stream, or of the coarse group that permutes it (None: the output's)."""
        while self.groups.stream(gid) not in first and (root := self.groups.find(gid)) in self.groups.coarse:
            gid = self.groups.coarse[root][0]
        return first.get(self.groups.stream(gid))

    def pinned_record(self) -> tuple[Pinned, ...]:
        """Per cause, in the order of the graph: the pinned units of every parameter axis, and their streams."""
        first, found = self.groups.first_causes(), {}
        for key, layouts in self.axes.items():
            for axis, layout in enumerate(layouts):
                for seg in layout or ():
                    if not isinstance(seg, Seg) or self.groups.resolve(seg).gid != FIXED:
                        continue
                    if (cause := self.cause_of(seg.gid, first)) is not None:
                        places, streams = found.setdefault(cause, ({}, {}))
                        places.setdefault((key, axis), None)
                        stream = self.groups.stream(seg.gid)
                        streams[stream] = max(streams.get(stream, 0), seg.length // seg.block)
        return tuple(
            Pinned(*cause, tuple(places), sum(streams.values()), any(map(self.written_by_layers, streams)))
            for cause, (places, streams) in found.items()
        )

    def written_by_layers(self, stream: int) -> bool:
        """Two or more layers write the units of ``stream`` (a residual stream; a packed projection writing its
        queries and keys, two groups, is one layer)."""
        layers = {
            point.split("@")[0]  # a packed projection's parts (``qkv@-1[0/3]``) are one layer
            for g, points in self.writers.items()
            if self.groups.stream(g) == stream
            for kind, point in points
            if kind == "layer"
        }
        return len(layers) > 1


def pinned_message(spec: PermutationSpec, params: Mapping[str, Tensor], share: float = PINNED_SHARE) -> str | None:
    """One line when ``spec`` (traced) leaves a stream or more than ``share`` of the parameters of ``params``
    on a pinned axis (module docstring); None otherwise."""
    if not spec.pinned:
        return None
    fraction = pinned_share(spec, params)
    streams = [p for p in spec.pinned if p.stream]
    if not streams and fraction <= share:
        return None
    first = (streams or list(spec.pinned))[0]
    kind = ", residual streams among them" if streams else ""
    return (
        f"trace_spec: {sum(p.units for p in spec.pinned)} units left unpermuted{kind} ({fraction:.0%} of the "
        f"parameters on a pinned axis), first by node {first.node!r} in {first.where} ({first.reason}); "
        "matching leaves them in place (spec.pinned lists them)"
    )


def pinned_share(spec: PermutationSpec, params: Mapping[str, Tensor]) -> float:
    """The share of the matched parameters of ``params`` (running statistics left out) that lie on an axis
    ``spec.pinned`` lists: the entries matching leaves in place."""
    matched = spec.matched(params)
    on_pinned = {name for p in spec.pinned for name, _ in p.places if name in matched}
    return sum(matched[k].numel() for k in on_pinned) / max(1, sum(v.numel() for v in matched.values()))


def warn_pinned(spec: PermutationSpec, params: Mapping[str, Tensor]) -> None:
    """:func:`pinned_message` as a :class:`PinnedWarning`, if any."""
    if (message := pinned_message(spec, params)) is not None:
        warnings.warn(message, PinnedWarning, stacklevel=caller_level())
