"""A :class:`~lmclab.core.spec.PermutationSpec` as plain data (strings, integers, lists, dicts) and back, so
that an alignment saved to a file carries the spec it permutes by (``torch.load(weights_only=True)`` reads
plain data; a pickled class it refuses). Each axis entry is a group name, ``None``, or a list of segments
``[group, length, block]``; headed groups are ``{group: [count, tie]}``; the units a trace pinned
(:class:`~lmclab.core.spec.Pinned`) ``[node, where, reason, [[name, axis], …], units, stream]``; the kinds
``{group: "orthogonal"}``, the gains ``{gain: [reader, …]}``, their biases ``{gain: bias}`` and offsets ``{gain: c}``,
and why a group's kind is narrower ``{group: reason}``.

>>> from lmclab.core.spec import PermutationSpec, Segment
>>> spec = PermutationSpec({"w": ("P_0", (Segment("P_1", 4, 2), Segment(None, 3)))}, frozenset({"w"}))
>>> spec_from_data(spec_to_data(spec)) == spec
True
"""

from __future__ import annotations

from typing import Any

from lmclab.core.heads import Heads
from lmclab.core.spec import Entry, PermutationSpec, Pinned, Segment


def spec_to_data(spec: PermutationSpec) -> dict[str, Any]:
    """``spec`` as plain data (module docstring)."""
    return {
        "axes": {name: [_entry_data(e) for e in axes] for name, axes in spec.axes.items()},
        "stats": sorted(spec.stats),
        "heads": {g: [h.count, h.tie] for g, h in spec.heads.items()},
        "pinned": [[p.node, p.where, p.reason, [list(x) for x in p.places], p.units, p.stream] for p in spec.pinned],
        "kinds": dict(spec.kinds),
        "gains": {gain: list(readers) for gain, readers in spec.gains.items()},
        "gain_biases": dict(spec.gain_biases),
        "gain_offsets": dict(spec.gain_offsets),
        "kind_reasons": dict(spec.kind_reasons),
    }


def _entry_data(entry: Entry) -> Any:
    """A segment as ``[group, length, block]``, with ``copies, run`` after them when it holds copies."""
    if not isinstance(entry, tuple):
        return entry
    return [[s.group, s.length, s.block] + ([s.copies, s.run] if s.copies > 1 else []) for s in entry]


def spec_from_data(data: Any, what: str = "spec") -> PermutationSpec:
    """The spec :func:`spec_to_data` wrote; one ``ValueError`` line naming ``what`` for anything else."""
    try:
        axes = {str(name): tuple(_entry(e) for e in entries) for name, entries in data["axes"].items()}
        heads = {str(g): Heads(int(count), str(tie)) for g, (count, tie) in data["heads"].items()}
        pinned = tuple(_pinned(*p) for p in data.get("pinned", ()))  # absent in files of lmclab before it
        kinds = {str(g): str(kind) for g, kind in data.get("kinds", {}).items()}  # absent before orthogonal maps
        gains = {str(gain): tuple(map(str, readers)) for gain, readers in data.get("gains", {}).items()}
        biases = {str(gain): str(bias) for gain, bias in data.get("gain_biases", {}).items()}
        offsets = {str(gain): float(c) for gain, c in data.get("gain_offsets", {}).items()}
        reasons = {str(g): str(why) for g, why in data.get("kind_reasons", {}).items()}
        stats = frozenset(str(s) for s in data["stats"])
        return PermutationSpec(axes, stats, heads, pinned, kinds, gains, biases, offsets, reasons)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"{what}: not a permutation spec as lmclab saves one ({type(exc).__name__}: {exc})") from None


def _pinned(node: Any, where: Any, reason: Any, places: Any, units: Any, stream: Any) -> Pinned:
    return Pinned(
        str(node), str(where), str(reason), tuple((str(n), int(a)) for n, a in places), int(units), bool(stream)
    )


def _entry(data: Any) -> Entry:
    if data is None or isinstance(data, str):
        return data
    if not isinstance(data, list):
        raise TypeError(f"an axis entry must be a group name, null or a list of segments, got {data!r}")
    return tuple(Segment(None if g is None else str(g), *map(int, sizes)) for g, *sizes in map(_segment_data, data))


def _segment_data(data: Any) -> list:
    if not isinstance(data, list) or len(data) not in (3, 5):
        raise TypeError(f"a segment must be [group, length, block] (and copies, run), got {data!r}")
    return data
