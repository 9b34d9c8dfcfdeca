"""Headed permutation groups: the symmetries of multi-head attention.

The ``E = H·d`` features of a multi-head attention's queries and keys (or values) are ``H`` heads of
``d`` features. Permuting them by an arbitrary permutation of ``E`` changes the function; what leaves it
unchanged is a permutation σ of the heads *shared* by Q/K and V/O (the heads are summed after the output
projection, so their order is free as long as each head keeps its own queries, keys and values) and,
inside head ``h``, a permutation τ^qk_h shared by the rows of W_Q and W_K (the logits are
``q·k = Σ_j q_j k_j``) and an independent τ^vo_h shared by the rows of W_V and the columns of W_O.

A :class:`Heads` marks a group of a :class:`~lmclab.core.spec.PermutationSpec` as headed: its
permutations are restricted to ``perm[h·d + j] = σ[h]·d + τ_h[j]``, and every group with the same
``tie`` shares σ. A headed permutation is still a plain index tensor over the ``E`` units, so applying,
inverting and composing it need nothing new (headed permutations are closed under both).

Inside a head the symmetry is larger (Theus et al. 2025, Section 3): ``q·k = qᵀRᵀRk`` for any orthogonal ``R``
shared by a head's queries and keys, and ``W_O W_V = (W_O Rᵀ)(R W_V)`` for any orthogonal ``R`` of a head's
values. A headed group the spec marks ``"orthogonal"`` takes such an element: the matrix whose block
``(h, σ[h])`` is an orthogonal ``R_h`` (``d × d``) and every other block zero — the matrix of a headed
permutation when each ``R_h`` is ``τ_h``'s. These matrices are closed under products and transposes, so they
too are applied, inverted and composed as any orthogonal matrix is (:mod:`lmclab.core.orthogonal`).

Rotary positions (RoPE, ``q' = q·cos + rotate_half(q)·sin``) turn each plane ``(j, j + d/2)`` of a head's
queries and keys by an angle ``θ_j·t`` of its own, so only maps that commute with every such turn keep
``q'·k'``: one 2 × 2 rotation per plane, ``R = ⊕_j R(φ_j)`` (reflections reverse the turn, and a map mixing
two planes mixes two frequencies). A headed group the spec marks ``"rotary"`` takes such an ``R_h`` per head
(:func:`plane_rotations`). Its best element on a block ``B`` is closed form: plane ``j`` contributes
``(B_jj + B_j'j')·cos φ + (B_j'j − B_jj')·sin φ`` (``j' = j + d/2``), largest at ``φ = atan2(B_j'j − B_jj',
B_jj + B_j'j')`` with value ``√((B_jj + B_j'j')² + (B_j'j − B_jj')²)`` (:func:`best_planes`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple

import torch
from torch import Tensor

from lmclab.core.orthogonal import POLAR, as_matrix, is_matrix, random_orthogonal


class Heads(NamedTuple):
    """A headed group: ``count`` heads of equal size; groups with the same ``tie`` share the head order σ."""

    count: int
    tie: str


def head_size(group: str, size: int, heads: Heads) -> int:
    """``d``, the units per head of ``group`` (``size`` units in ``heads.count`` heads)."""
    if heads.count < 1 or size % heads.count:
        raise ValueError(f"group {group!r}: {size} units do not split into {heads.count} heads of equal size")
    return size // heads.count


def headed_permutation(sigma: Tensor, taus: Tensor) -> Tensor:
    """``perm[h·d + j] = σ[h]·d + τ_h[j]`` from σ (H,) and the within-head permutations ``taus`` (H, d)."""
    d = taus.shape[1]
    return (sigma[:, None] * d + taus).reshape(-1)


def headed_matrix(sigma: Tensor, rotations: Tensor) -> Tensor:
    """The matrix whose block ``(h, σ[h])`` is ``rotations[h]`` (``(H, d, d)``), every other block zero."""
    count, d = rotations.shape[:2]
    out = rotations.new_zeros(count, d, count, d)
    out[torch.arange(count), :, sigma, :] = rotations
    return out.reshape(count * d, count * d)


def plane_rotations(angles: Tensor) -> Tensor:
    """``(H, d, d)``: per head the rotation of each plane ``(j, j + d/2)`` by ``angles[h, j]`` (``(H, d/2)``)."""
    count, half = angles.shape
    out = angles.new_zeros(count, 2 * half, 2 * half)
    j = torch.arange(half)
    cos, sin = torch.cos(angles), torch.sin(angles)
    out[:, j, j], out[:, j + half, j + half] = cos, cos
    out[:, j, j + half], out[:, j + half, j] = -sin, sin
    return out


def best_planes(blocks: Tensor) -> tuple[Tensor, Tensor]:
    """Per block ``B`` (``(…, d, d)``) the plane rotation maximising ``⟨R, B⟩`` and that maximum (module
    docstring): ``(rotations (…, d, d), values (…))``."""
    half = blocks.shape[-1] // 2
    j = torch.arange(half)
    even = blocks[..., j, j] + blocks[..., j + half, j + half]
    odd = blocks[..., j + half, j] - blocks[..., j, j + half]
    angles = torch.atan2(odd, even)
    rotations = plane_rotations(angles.reshape(-1, half)).reshape(*blocks.shape)
    return rotations, torch.sqrt(even**2 + odd**2).sum(-1)


def split_headed(perm: Tensor, count: int, atol: float = 1e-6) -> tuple[Tensor, Tensor] | None:
    """``(σ, taus)`` of a headed ``perm`` of ``count`` heads, or ``(σ, R)`` (``R``: the ``(H, d, d)`` blocks
    ``(h, σ[h])``) of a headed matrix; ``None`` when ``perm`` moves a unit to another head than the rest of
    its head (a permutation that crosses heads; a matrix with a block off ``σ`` above ``atol``)."""
    if is_matrix(perm):
        blocks = perm.reshape(count, perm.shape[0] // count, count, -1).transpose(1, 2)  # (h, h', d, d)
        size = blocks.abs().amax(dim=(2, 3))
        sigma = size.argmax(1)
        off = size.index_put((torch.arange(count), sigma), size.new_zeros(count))
        if float(off.max()) > atol or not torch.equal(torch.sort(sigma).values, torch.arange(count)):
            return None
        return sigma, blocks[torch.arange(count), sigma]
    blocks = perm.reshape(count, -1)
    d = blocks.shape[1]
    sigma = blocks[:, 0] // d
    if not torch.equal(blocks // d, sigma[:, None].expand_as(blocks)):
        return None
    return sigma, blocks - sigma[:, None] * d


def tie_sets(groups: Iterable[str], heads: Mapping[str, Heads]) -> list[tuple[str, ...]]:
    """``groups`` (sorted) partitioned into the sets solved together: a plain group alone, the headed
    groups of one tie together."""
    units: dict[str, list[str]] = {}
    for g in sorted(groups):
        units.setdefault(f"tie:{heads[g].tie}" if g in heads else g, []).append(g)
    return [tuple(members) for members in units.values()]


def random_headed(
    sizes: Mapping[str, int],
    heads: Mapping[str, Heads],
    generator: torch.Generator,
    kinds: Mapping[str, str] | None = None,
) -> dict[str, Tensor]:
    """A uniformly random headed element of every headed group: one σ per tie, and per head and group a
    random τ, a Haar-random ``R`` for a group ``kinds`` marks ``"orthogonal"``, or uniform angles of its
    planes for a ``"rotary"`` one (module docstring)."""
    out: dict[str, Tensor] = {}
    for members in tie_sets(heads, heads):
        count = heads[members[0]].count
        sigma = torch.randperm(count, generator=generator)
        for g in members:
            d = head_size(g, sizes[g], heads[g])
            if (kinds or {}).get(g) == "orthogonal":
                out[g] = headed_matrix(sigma, torch.stack([random_orthogonal(d, generator) for _ in range(count)]))
                continue
            if (kinds or {}).get(g) == "rotary":
                angles = torch.rand(count, d // 2, generator=generator, dtype=torch.float64) * (2 * math.pi)
                out[g] = headed_matrix(sigma, plane_rotations(angles))
                continue
            taus = torch.stack([torch.randperm(d, generator=generator) for _ in range(count)])
            out[g] = headed_permutation(sigma, taus)
    return out


def check_headed(
    perm: Mapping[str, Tensor],
    sizes: Mapping[str, int],
    heads: Mapping[str, Heads],
    kinds: Mapping[str, str] | None = None,
    atol: float = 1e-6,
) -> None:
    """One-line error unless every headed group keeps its heads whole and tied groups share σ (and a group
    ``kinds`` marks ``"rotary"`` turns each head's planes alone)."""
    sigmas: dict[str, tuple[str, Tensor]] = {}
    for g in sorted(heads):
        d = head_size(g, sizes[g], heads[g])
        split = split_headed(perm[g].cpu(), heads[g].count)
        if split is None:
            what = "orthogonal map" if is_matrix(perm[g]) else "permutation"
            raise ValueError(f"{what} of group {g!r} crosses heads (it must map each head onto one head)")
        blocks = split[1] if is_matrix(perm[g]) else split_headed(as_matrix(perm[g].cpu()), heads[g].count)[1]
        if (kinds or {}).get(g) == "rotary" and (d % 2 or not _planar(blocks.double(), atol)):
            raise ValueError(f"group {g!r} is rotary: each head's map must turn its planes (j, j + {d // 2}) alone")
        first = sigmas.setdefault(heads[g].tie, (g, split[0]))
        if not torch.equal(first[1], split[0]):
            raise ValueError(
                f"permutations of groups {first[0]!r} and {g!r} order the heads differently; "
                f"they share the head permutation {heads[g].tie!r}"
            )


def _planar(rotations: Tensor, atol: float) -> bool:
    """Whether every ``(d, d)`` block is a rotation of each plane ``(j, j + d/2)`` alone."""
    closest, _ = best_planes(rotations)
    return float((closest - rotations).abs().max()) <= atol if rotations.numel() else True


def solve_tied(
    costs: Mapping[str, Tensor],
    heads: Mapping[str, Heads],
    solve: Callable[[Tensor], Tensor],
    kinds: Mapping[str, str] | None = None,
) -> dict[str, Tensor]:
    """The elements maximising ``Σ_g ⟨M_g, costs[g]⟩`` over one tie set, exactly (``M_g``: the matrix of the
    permutation ``perm_g``, so that ``⟨M_g, C_g⟩ = Σ_i C_g[i, perm_g[i]]``; ``kinds``: the groups whose elements
    are orthogonal maps instead, :mod:`lmclab.core.orthogonal`).

    A plain group is one assignment ``solve(cost)``, or for an orthogonal (centred) group the polar factor of
    its cost. For the headed groups of one tie, the cost decomposes: for heads ``(h, h')`` and group ``g``, the
    best τ is the assignment on the block ``C_g[h·d:(h+1)·d, h'·d:(h'+1)·d]`` with value ``v_g(h, h')``, or for a
    group ``kinds`` marks orthogonal the polar factor of the block, whose value is the block's nuclear norm
    (``max_R ⟨R, B⟩ = Σ singular values of B``), or for a rotary one its best plane rotations
    (:func:`best_planes`); σ is the assignment on ``Σ_g v_g``, and each group takes the
    blocks of the head pairs σ chose (``H²`` assignments or SVDs of size ``d`` per group and one of size ``H``)."""
    kinds = kinds or {}
    if len(costs) == 1 and next(iter(costs)) not in heads:
        ((g, cost),) = costs.items()
        return {g: POLAR[kinds[g]](cost) if kinds.get(g) in POLAR else solve(cost)}
    count = heads[next(iter(costs))].count
    within, value = {}, torch.zeros(count, count, dtype=torch.float64)
    for g, cost in costs.items():
        d = head_size(g, cost.shape[0], heads[g])
        blocks = cost.detach().cpu().double().reshape(count, d, count, d).transpose(1, 2)  # (h, h', d, d)
        if kinds.get(g) == "orthogonal":
            u, singular, vh = torch.linalg.svd(blocks)  # every head pair at once
            within[g], value = u @ vh, value + singular.sum(-1)
            continue
        if kinds.get(g) == "rotary":
            within[g], best = best_planes(blocks)
            value = value + best
            continue
        within[g] = [[solve(blocks[h, k]) for k in range(count)] for h in range(count)]
        for h in range(count):
            for k in range(count):
                value[h, k] += blocks[h, k][torch.arange(d), within[g][h][k]].sum()
    sigma, rows = solve(value), torch.arange(count)
    return {
        g: headed_matrix(sigma, best[rows, sigma])
        if kinds.get(g) in ("orthogonal", "rotary")
        else headed_permutation(sigma, torch.stack([best[h][int(sigma[h])] for h in range(count)]))
        for g, best in within.items()
    }
