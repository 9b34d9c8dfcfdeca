"""Permutation symmetries of a network: the one contract between architectures and algorithms.

A :class:`PermutationSpec` says, for every entry of a ``state_dict``, which permutation group
acts on each of its axes (``None``: that axis is never permuted). Groups are hidden-unit (or
channel) permutations ``P_ℓ`` of the paper's Section 2. Inputs and logits are never permuted.

A *permutation* ``perm`` maps each group name to an index tensor. Applying it to ``θb`` gives
``π(θb)`` with ``W'_ℓ = P_ℓ W_ℓ P_{ℓ-1}ᵀ``, i.e. ``W'[i, j] = W[perm_ℓ[i], perm_{ℓ-1}[j]]``.

An axis may also be *composite*: a tuple of :class:`Segment` s, consecutive stretches of the axis
each permuted by its own group (``None``: left alone) in blocks of ``block`` entries. A flatten of a
``C × H × W`` map onto the features of a Linear is one segment with ``block = H·W`` (unit ``c``
owns features ``c·HW … c·HW + HW − 1``); a concatenation of channel groups is one segment per
group. A plain group name is the one-segment, block-1 case.

Architectures build specs with the small helpers of :mod:`lmclab.core.spec_builders` (a layer's
or a residual block's axes), looped over their config (never hand-listed line by line), joined by
:func:`build_spec`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import Tensor

from lmclab.core.heads import Heads, check_headed, head_size, random_headed
from lmclab.core.orthogonal import KINDS, RANDOM, act, check_matrix, composed, inverse, is_matrix
from lmclab.core.segments import (  # noqa: F401 (the spec's vocabulary, imported from here by its users)
    Axes,
    Entry,
    Segment,
    axis_index,
    entry_groups,
    group_slices,
    segments,
    unit_places,
    unit_rows,
)

Params = dict[str, Tensor]
Permutation = dict[str, Tensor]


class Pinned(NamedTuple):
    """Units a traced spec leaves unpermuted though the model's inputs and outputs do not ask it: ``units``
    units on the tensor axes ``places`` (name, axis), pinned by graph node ``node`` in module ``where``
    (:mod:`lmclab.trace`) because of ``reason``; ``stream``: two or more layers write them (a residual stream)."""

    node: str
    where: str
    reason: str
    places: tuple[tuple[str, int], ...]
    units: int
    stream: bool


@dataclass(frozen=True)
class PermutationSpec:
    """Which permutation group acts on which (parameter, axis).

    ``axes[name][k]`` is the group acting on axis ``k`` of ``state_dict[name]`` or ``None``.
    ``stats`` names buffers (BatchNorm running statistics, counters) that are permuted but
    excluded from matching costs and L2 distances. ``heads`` marks the headed groups of attention
    (:mod:`lmclab.core.heads`): their permutations keep heads whole and share σ within a tie. ``pinned``
    (a traced spec's) says which units the tracer left unpermuted, where and why; it is a report, not part
    of the symmetry: two specs that differ only there are equal. ``kinds`` marks the groups on which every
    orthogonal map is a symmetry too (``"orthogonal"``, :mod:`lmclab.core.orthogonal`) once every per-channel
    gain on them is 1: ``gains`` maps each such gain to the weights that read it (:mod:`lmclab.core.canonical`),
    ``gain_offsets`` the gains a model reads as ``c + w`` to ``c``; ``kind_reasons`` (a report, as ``pinned``)
    why each other group's kind is narrower (the node that keeps it so)."""

    axes: Mapping[str, Axes]
    stats: frozenset[str] = field(default_factory=frozenset)
    heads: Mapping[str, Heads] = field(default_factory=dict)
    pinned: tuple[Pinned, ...] = field(default=(), compare=False)
    kinds: Mapping[str, str] = field(default_factory=dict)
    gains: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    gain_biases: Mapping[str, str] = field(default_factory=dict)  # LayerNorm's gain -> its bias (scaled by 1/g)
    gain_offsets: Mapping[str, float] = field(default_factory=dict)  # a gain read as c + w (Gemma's 1 + w) -> c
    kind_reasons: Mapping[str, str] = field(default_factory=dict, compare=False)  # group -> why its kind is narrower

    @property
    def groups(self) -> dict[str, list[tuple[str, int]]]:
        """Inverse view: group -> [(param name, axis)], in declaration order."""
        out: dict[str, list[tuple[str, int]]] = {}
        for name, name_axes in self.axes.items():
            for axis, entry in enumerate(name_axes):
                for group in entry_groups(entry):
                    out.setdefault(group, []).append((name, axis))
        return out

    def group_sizes(self, params: Mapping[str, Tensor]) -> dict[str, int]:
        """Size of each group, read off ``params``; raises if two axes of a group disagree."""
        sizes: dict[str, int] = {}
        for group, places in self.groups.items():
            for name, axis in places:
                size = entry_shape(params, name)[axis]
                for _, length, block, copies, run in group_slices(self.axes[name][axis], group, size):
                    n, where = length // (block * copies), f"group {group!r}: axis {axis} of {name!r} has {length}"
                    copied = f" ({copies} copies in runs of {run} units)" * (copies > 1)
                    if length % (block * copies * run):
                        raise ValueError(f"{where} entries, not whole units of {block}{copied}")
                    if sizes.setdefault(group, n) != n:
                        raise ValueError(f"{where} entries in blocks of {block}{copied}, expected {sizes[group]} units")
        return sizes

    def matched(self, params: Mapping[str, Tensor]) -> Params:
        """The entries that count in matching costs and distances (no running statistics)."""
        return {k: v for k, v in params.items() if k not in self.stats}

    def matched_names(self, params: Mapping[str, Tensor]) -> list[str]:
        """The names of :meth:`matched`'s entries, none of them read (a checkpoint read lazily stays on disk)."""
        return [k for k in params if k not in self.stats]

    def check(self, params: Mapping[str, Tensor], what: str = "state_dict") -> None:
        """One-line error unless ``params`` has exactly the spec's keys and consistent shapes."""
        missing, extra = sorted(set(self.axes) - set(params)), sorted(set(params) - set(self.axes))
        if missing or extra:
            raise ValueError(
                f"{what}: keys do not match the permutation spec (missing {missing[:3]}, unexpected {extra[:3]})"
            )
        for name, name_axes in self.axes.items():
            if params[name].dim() != len(name_axes):
                raise ValueError(f"{what}: {name!r} has {params[name].dim()} axes, the spec declares {len(name_axes)}")
            for axis, entry in enumerate(name_axes):
                total = sum(seg.length for seg in segments(entry, params[name].shape[axis]))
                if total != params[name].shape[axis]:
                    raise ValueError(
                        f"{what}: axis {axis} of {name!r} has {params[name].shape[axis]} "
                        f"entries, the spec's segments cover {total}"
                    )
        sizes, counts = self.group_sizes(params), {}
        for group, kind in self.kinds.items():
            if group not in sizes or kind not in KINDS or (kind == "rotary" and group not in self.heads):
                raise ValueError(
                    f"{what}: kind {kind!r} of {group!r}: expected one of {KINDS} for a spec group (rotary: headed)"
                )
        for group, heads in self.heads.items():
            if group not in sizes:
                raise ValueError(f"{what}: headed group {group!r} acts on no axis of the spec")
            if counts.setdefault(heads.tie, heads.count) != heads.count:
                raise ValueError(f"{what}: groups tied by {heads.tie!r} have different numbers of heads")
            head_size(group, sizes[group], heads)


def stats_of(axes: Iterable[str]) -> frozenset[str]:
    """Names of running-statistic buffers among ``axes`` (excluded from costs and distances)."""
    suffixes = (".running_mean", ".running_var", ".num_batches_tracked")
    return frozenset(k for k in axes if k.endswith(suffixes))


def build_spec(*parts: Mapping[str, Axes], heads: Mapping[str, Heads] | None = None) -> PermutationSpec:
    """Join builder outputs into a spec (``heads``: its headed groups); a key declared twice is an error."""
    axes: dict[str, Axes] = {}
    for part in parts:
        for name, name_axes in part.items():
            if name in axes:
                raise ValueError(f"permutation spec declares {name!r} twice")
            axes[name] = tuple(name_axes)
    return PermutationSpec(axes=axes, stats=stats_of(axes), heads=dict(heads or {}))


# ---- operations on permutations -------------------------------------------------------------


def apply_permutation(spec: PermutationSpec, perm: Mapping[str, Tensor], params: Mapping[str, Tensor]) -> Params:
    """``π(θ)``: permute every axis of every entry by its group's index tensor."""
    out = {name: permute_entry(spec, perm, name, value) for name, value in params.items()}
    return with_metadata(out, params)


def permute_entry(spec: PermutationSpec, perm: Mapping[str, Tensor], name: str, value: Tensor) -> Tensor:
    """The entry ``name`` of ``π(θ)`` from its value ``value`` in ``θ`` (every permuted axis acted on)."""
    for axis, entry in enumerate(spec.axes[name]):
        if entry_groups(entry):
            value = act_on_axis(value, axis, entry, perm)
    return value


def entry_shape(params: Mapping[str, Tensor], name: str) -> torch.Size:
    """The shape of ``params[name]``, from the mapping's ``shapes`` when it has them (a checkpoint read lazily,
    :class:`lmclab.core.shards.ShardedWeights`: no tensor read)."""
    shapes = getattr(params, "shapes", None)
    return shapes[name] if shapes is not None else params[name].shape


def act_on_axis(value: Tensor, axis: int, entry: Entry, perm: Mapping[str, Tensor]) -> Tensor:
    """``perm`` applied along ``axis`` of ``value`` (``entry``: the groups acting on it), each group's element
    an index tensor (a permutation) or a matrix (an orthogonal map, :func:`lmclab.core.orthogonal.act`)."""
    if not any(is_matrix(perm[g]) for g in entry_groups(entry)):
        return value.index_select(axis, axis_index(entry, perm, value.shape[axis]).to(value.device))
    parts, offset = [], 0
    for seg in segments(entry, value.shape[axis]):
        part = value.narrow(axis, offset, seg.length)
        parts.append(part if seg.group is None else act_on_copies(part, axis, perm[seg.group], seg))
        offset += seg.length
    return torch.cat(parts, axis)


def act_on_copies(part: Tensor, axis: int, element: Tensor, seg: Segment) -> Tensor:
    """``element`` applied to the units of the stretch ``part`` of ``seg`` along ``axis``: to each copy alike
    (:func:`lmclab.core.segments.unit_places`)."""
    if seg.copies == 1:
        return act(part, axis, element, seg.block)
    order = unit_places(seg.length, seg.block, seg.copies, seg.run).transpose(0, 1).reshape(-1).to(part.device)
    copies = part.index_select(axis, order).chunk(seg.copies, axis)  # copy by copy, each unit by unit
    mixed = torch.cat([act(c, axis, element, seg.block) for c in copies], axis)
    return torch.empty_like(part).index_copy_(axis, order, mixed)


def with_metadata(out: Params, like: Mapping[str, Tensor]) -> Params:
    """``out`` carrying ``like``'s state-dict metadata (the module versions that ``load_state_dict`` reads:
    torchvision's MNASNet refuses a state dict without them)."""
    meta = getattr(like, "_metadata", None)
    if meta is None:
        return out
    kept = OrderedDict(out)
    kept._metadata = meta  # type: ignore[attr-defined]
    return kept


def invert(perm: Mapping[str, Tensor]) -> Permutation:
    """``π⁻¹``: the argsort of an index tensor, the transpose of an orthogonal matrix."""
    return {g: inverse(p) for g, p in perm.items()}


def compose(outer: Mapping[str, Tensor], inner: Mapping[str, Tensor]) -> Permutation:
    """The element equal to applying ``inner`` first, then ``outer`` (per group, of either kind)."""
    return {g: composed(outer[g], inner[g]) for g in inner}


def identity_permutation(sizes: Mapping[str, int]) -> Permutation:
    """``π = I`` for every group."""
    return {g: torch.arange(n) for g, n in sizes.items()}


def random_permutation(
    sizes: Mapping[str, int],
    generator: torch.Generator,
    heads: Mapping[str, Heads] | None = None,
    kinds: Mapping[str, str] | None = None,
) -> Permutation:
    """A uniformly random permutation of every group, drawn from ``generator`` (headed groups: uniform
    over the permutations that keep their heads whole, one σ per tie); a group that ``kinds`` marks
    ``"orthogonal"``/``"centred"`` gets a Haar-random matrix of its kind (headed: per head; ``"rotary"``: per plane)."""
    heads, kinds = heads or {}, kinds or {}
    perm = {
        g: RANDOM[kinds[g]](n, generator) if kinds.get(g) in RANDOM else torch.randperm(n, generator=generator)
        for g, n in sorted(sizes.items())
        if g not in heads
    }
    return {**perm, **random_headed(sizes, heads, generator, kinds)} if heads else perm


def check_permutation(
    perm: Mapping[str, Tensor],
    sizes: Mapping[str, int],
    heads: Mapping[str, Heads] | None = None,
    kinds: Mapping[str, str] | None = None,
) -> None:
    """One-line error unless ``perm`` is a bijection of the right size for every group and keeps the
    ``heads`` of every headed group whole (tied groups with one head order); a matrix is accepted for a
    group that ``kinds`` marks ``"orthogonal"`` (``"centred"``) when it is an orthogonal matrix of the group's
    size (that fixes the all-ones vector; ``"rotary"``: that turns each head's planes alone)."""
    if set(perm) != set(sizes):
        raise ValueError(f"permutation groups {sorted(perm)} do not match the spec's {sorted(sizes)}")
    for g, n in sizes.items():
        p = perm[g]
        if is_matrix(p):
            check_matrix(g, p, n, (kinds or {}).get(g, "permutation"))
        elif p.shape != (n,) or not torch.equal(torch.sort(p).values, torch.arange(n)):
            raise ValueError(f"permutation of group {g!r} is not a bijection of {n} units")
    check_headed(perm, sizes, heads or {}, kinds)
