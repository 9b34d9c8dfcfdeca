"""Merge/unmerge transforms: merging N models beyond permutations.

Each group ``g`` of a :class:`~lmclab.core.spec.PermutationSpec` gets, per model ``i``, a *merge* matrix
``M_i^g`` (``n_merged × n_i``) and an *unmerge* matrix ``U_i^g`` (``n_i × n_merged``) (Stoica et al. 2024,
"ZipIt!", Section 4: merge features with M, undo it on the next layer's inputs with U). The merged model is

    θ = Σ_i M_i θ_i U_i,

i.e. on every parameter, ``M_i^g`` acts on the axis where the parameter *produces* group-g features and
``U_i^g`` on every axis where it *consumes* them (``W = Σ_i M_i^ℓ W_i U_i^{ℓ−1}`` for a dense layer,
``b = Σ_i M_i^ℓ b_i``). Which axis produces is read off the spec in one place, :func:`producing_axis`:
axis 0 of a weight ``(out, in, …)`` and the only axis of a vector (bias, norm parameters, running
statistics); the last axis of a *token tensor* — three or more axes of which only the last is grouped
(position embeddings, class and mask tokens ``(1, tokens, features)``), which is added to the stream.
Every other grouped axis consumes. Stretches of a producing axis that no group acts on (a classifier's
logits, a counter) are the model-weighted average ``Σ_i w_i θ_i`` (``w_i = 1/N`` by default).

Permutations are the special case ``M_i = w_i P_i``, ``U_i = P_iᵀ`` (:func:`permutation_transforms`):
then θ is MergeMany's mean of the aligned models. A general linear map mixes units, which
multi-head attention's headed groups do not allow (heads would mix): specs with headed groups are
refused. Running statistics: ``running_mean`` is mapped like any vector (the mean of ``M_i z_i`` is
``M_i μ_i``), ``running_var`` cannot be mapped linearly and gets ``|M_i|`` (entrywise: non-negative,
MergeMany's average for permutations) as a placeholder — a merged BatchNorm network needs its
statistics recomputed (:func:`lmclab.core.bn_repair.repair_bn`), and both CCA Merge and ZipIt! need
REPAIR (:func:`lmclab.search.features.repair_transformed`).

*Partial zipping* (ZipIt! Section 4.3): only the groups in ``zipped`` are merged; every model keeps its
own later layers, fed the merged features through ``U_i`` (:func:`partial_merge`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from lmclab.core.spec import Axes, Entry, Params, Permutation, PermutationSpec, entry_groups, segments

Transform = dict[str, Tensor]  # group -> matrix


class TransformResult(NamedTuple):
    """The result of a transform merge (CCA Merge, ZipIt!)."""

    merges: list[Transform]  # M_i^g, (n_merged, n_i), per model in input order
    unmerges: list[Transform]  # U_i^g, (n_i, n_merged)
    merged: Params | None  # Σ_i M_i θ_i U_i (None for a partial zip)
    heads: list[Params]  # partial zip: one full network per model (shared zipped layers); else []
    stats: dict


def producing_axis(axes: Axes) -> int | None:
    """The axis on which a parameter with these spec ``axes`` produces features (module docstring);
    ``None`` for a scalar."""
    if not axes:
        return None
    grouped = [k for k, entry in enumerate(axes) if entry_groups(entry)]
    return len(axes) - 1 if len(axes) >= 3 and grouped == [len(axes) - 1] else 0


def _map_units(value: Tensor, axis: int, offset: int, length: int, block: int, matrix: Tensor) -> Tensor:
    """``matrix`` (m × n) applied to the ``n = length / block`` units of a stretch of ``axis``."""
    stretch = value.narrow(axis, offset, length).movedim(axis, 0)  # (length, …)
    rest = stretch.shape[1:]
    units = stretch.reshape(length // block, -1)  # (n, block · rest)
    out = matrix.to(units) @ units  # (m, block · rest)
    return out.reshape(matrix.shape[0] * block, *rest).movedim(0, axis).contiguous()  # as a module's state dict


def _map_axis(value: Tensor, axis: int, entry: Entry, mats: Mapping[str, Tensor], weight: float | None) -> Tensor:
    """Every grouped stretch of ``axis`` mapped by its group's matrix (groups absent from ``mats`` kept);
    ungrouped stretches multiplied by ``weight`` (``None``: kept)."""
    parts, offset = [], 0
    for seg in segments(entry, value.shape[axis]):
        if seg.group is not None and seg.group in mats and seg.copies > 1:
            raise ValueError(f"group {seg.group!r} is read in copies (grouped queries): its units cannot be merged")
        if seg.group is not None and seg.group in mats:
            parts.append(_map_units(value, axis, offset, seg.length, seg.block, mats[seg.group]))
        else:
            part = value.narrow(axis, offset, seg.length)
            parts.append(part if weight is None or seg.group is not None else weight * part)
        offset += seg.length
    return parts[0] if len(parts) == 1 else torch.cat(parts, axis)


def transformed(
    spec: PermutationSpec, params: Mapping[str, Tensor], merge: Transform, unmerge: Transform, weight: float = 1.0
) -> Params:
    """One model's term ``M_i θ_i U_i`` (groups missing from ``merge``/``unmerge`` are left alone;
    ungrouped producing stretches times ``weight``); integer buffers are copied."""
    consume = {g: u.T for g, u in unmerge.items()}  # U acts on units as Uᵀ: W U = (Uᵀ Wᵀ)ᵀ
    out: Params = {}
    for name, value in params.items():
        if not value.is_floating_point():
            out[name] = value.clone()
            continue
        axes, produce = spec.axes[name], producing_axis(spec.axes[name])
        for axis, entry in enumerate(axes):
            if axis == produce:
                mats = {g: m.abs() for g, m in merge.items()} if name.endswith(".running_var") else merge
                value = _map_axis(value, axis, entry, mats, weight)
            elif entry_groups(entry):
                value = _map_axis(value, axis, entry, consume, None)
        out[name] = weight * value if produce is None else value
    return out


def check_transforms(
    spec: PermutationSpec,
    params: Sequence[Mapping[str, Tensor]],
    merges: Sequence[Transform],
    unmerges: Sequence[Transform],
    groups: Collection[str] | None = None,
) -> None:
    """One-line ``ValueError`` unless every model fits the spec and has a merge and an unmerge matrix of
    matching shapes for every group in ``groups`` (default: all of the spec's), and no group is headed."""
    if spec.heads:
        raise ValueError(
            f"group {sorted(spec.heads)[0]!r} is headed: a general linear map would mix attention heads; "
            "merge/unmerge transforms need plain groups"
        )
    if not len(params) == len(merges) == len(unmerges) >= 1:
        raise ValueError(
            f"merges and unmerges must hold one transform per model ({len(params)}), got "
            f"{len(merges)} and {len(unmerges)}"
        )
    groups = list(spec.groups) if groups is None else list(groups)
    for i, (p, merge, unmerge) in enumerate(zip(params, merges, unmerges, strict=True)):
        spec.check(p, f"params[{i}]")
        sizes = spec.group_sizes(p)
        for g in groups:
            if g not in merge or g not in unmerge:
                raise ValueError(f"model {i}: group {g!r} has no merge or unmerge matrix")
            m = merges[0][g].shape[0]
            if merge[g].shape != (m, sizes[g]) or unmerge[g].shape != (sizes[g], m):
                raise ValueError(
                    f"model {i}, group {g!r}: merge {tuple(merge[g].shape)} and unmerge {tuple(unmerge[g].shape)} "
                    f"must be ({m}, {sizes[g]}) and ({sizes[g]}, {m})"
                )


def merge_weights(weights: Sequence[float] | None, n: int) -> list[float]:
    """``weights`` checked (n ≥ 1 non-negative numbers summing to 1), 1/n each by default."""
    if n < 1:
        raise ValueError("weights: there is no model to weigh (got none)")
    weights = [1 / n] * n if weights is None else [float(w) for w in weights]
    if len(weights) != n or min(weights) < 0 or abs(sum(weights) - 1) > 1e-9:
        raise ValueError(f"weights must be {n} non-negative numbers summing to 1, got {weights}")
    return weights


def _sum(parts: Sequence[Params]) -> Params:
    """Element-wise sum in model order; integer buffers from the first model."""
    return {k: sum(p[k] for p in parts) if v.is_floating_point() else v.clone() for k, v in parts[0].items()}


def transform_merge(
    spec: PermutationSpec,
    params: Sequence[Mapping[str, Tensor]],
    merges: Sequence[Transform],
    unmerges: Sequence[Transform],
    *,
    weights: Sequence[float] | None = None,
) -> Params:
    """``θ = Σ_i M_i θ_i U_i`` (module docstring); ``weights`` (default 1/N each) weigh the ungrouped
    outputs, e.g. the logits."""
    check_transforms(spec, params, merges, unmerges)
    weights = merge_weights(weights, len(params))
    return _sum([transformed(spec, *parts) for parts in zip(params, merges, unmerges, weights, strict=True)])


def permutation_transforms(
    perms: Sequence[Permutation], weights: Sequence[float] | None = None
) -> tuple[list[Transform], list[Transform]]:
    """``M_i = w_i P_i``, ``U_i = P_iᵀ`` with ``P[k, perm[k]] = 1`` (apply_permutation's convention:
    unit ``perm[k]`` lands on ``k``); :func:`transform_merge` of them is the mean of the aligned models."""
    weights = merge_weights(weights, len(perms))
    matrices = [{g: torch.eye(len(p), dtype=torch.float64)[p.cpu()] for g, p in perm.items()} for perm in perms]
    return [{g: w * p for g, p in mats.items()} for w, mats in zip(weights, matrices, strict=True)], [
        {g: p.T for g, p in mats.items()} for mats in matrices
    ]


def _shared(spec: PermutationSpec, name: str, zipped: Collection[str]) -> bool:
    """Is ``name`` a zipped (shared) parameter? Refuses one that merges features from unmerged inputs."""
    axes, produce, zipped = spec.axes[name], producing_axis(spec.axes[name]), set(zipped)
    out = set() if produce is None else set(entry_groups(axes[produce]))
    into = {g for k, e in enumerate(axes) if k != produce for g in entry_groups(e)}
    if out & zipped and not out <= zipped:
        raise ValueError(f"partial zip: {name!r} produces zipped and unzipped groups {sorted(out)}")
    if out and out <= zipped and not into <= zipped:
        raise ValueError(
            f"partial zip: {name!r} produces zipped {sorted(out)} from unzipped {sorted(into - zipped)}; "
            "zip a prefix of the network"
        )
    return bool(out | into) and (out | into) <= zipped


def partial_merge(
    spec: PermutationSpec,
    params: Sequence[Mapping[str, Tensor]],
    merges: Sequence[Transform],
    unmerges: Sequence[Transform],
    zipped: Collection[str],
    *,
    weights: Sequence[float] | None = None,
) -> list[Params]:
    """Partial zipping: one full network per model whose parameters producing (or, output-free, only
    consuming) ``zipped`` groups are the shared ``Σ_j M_j θ_j U_j`` and whose others are model i's own,
    its zipped inputs read through ``U_i``. Ungrouped parameters stay each model's own. The partially
    zipped model runs the shared layers once and every model's tail; for models of one task its output is
    the mean of the tails' outputs."""
    check_transforms(spec, params, merges, unmerges, zipped)
    weights = merge_weights(weights, len(params))
    merges = [{g: m[g] for g in zipped} for m in merges]
    unmerges = [{g: u[g] for g in zipped} for u in unmerges]
    shared_names = [k for k in spec.axes if _shared(spec, k, zipped)]
    shared = _sum(
        [
            transformed(spec, {k: p[k] for k in shared_names}, m, u, w)
            for p, m, u, w in zip(params, merges, unmerges, weights, strict=True)
        ]
    )
    own = [{k: v for k, v in p.items() if k not in shared} for p in params]
    return [{**shared, **transformed(spec, o, {}, u)} for o, u in zip(own, unmerges, strict=True)]
