"""The Sinkhorn searches over a spec with orthogonal groups: Sinkhorn's soft permutations for the permutation
groups, and every orthogonal group an exact element of its kind, differentiable in a free latent matrix
(the paper's Sinkhorn STE, Appendix D.2, over Theus et al. 2025's mixed group).

A permutation is discrete, so Sinkhorn relaxes it to a doubly stochastic matrix and rounds it at the end
(:mod:`lmclab.search.sinkhorn`). An orthogonal group is a continuous group: its element is parameterised on the
group itself, from its start ``O₀`` (the identity, or weight matching's element) by the exponential of a
skew-symmetric matrix,

- ``orthogonal``: ``O = O₀ · exp(A − Aᵀ)`` (``A``: n × n), every rotation of ``O₀``'s component
  (``det O = det O₀``: the exponential map of the rotations is onto);
- ``centred``: ``O = O₀ · H diag(1, exp(A − Aᵀ)) H`` (``A``: (n − 1) × (n − 1); ``H``:
  :func:`lmclab.core.orthogonal.ones_basis`), which fixes the all-ones vector as ``O₀`` does;
- inside heads, per pair of heads ``(h, h')`` a block ``R[h, h'] = R₀[h, h'] · exp(A[h, h'] − A[h, h']ᵀ)``
  (``d × d``), or for a ``rotary`` group ``R₀[h, h'] · ⊕_j R(φ[h, h', j])``, one angle per plane
  (:func:`lmclab.core.heads.plane_rotations`).

The head order stays a permutation: the soft element of a headed orthogonal group is
:func:`~lmclab.search.sinkhorn.headed_soft` of its tie's Sinkhorn head scores and these exact blocks,
``P[h·d + j, h'·d + j'] = sinkhorn(S_t)[h, h'] · R[h, h'][j, j']`` — the headed orthogonal element ``(σ, R[h,
σ(h)])`` when ``sinkhorn(S_t)`` is the permutation σ, as the headed soft permutation is. The gradient is exact
(autograd through ``matrix_exp``) and every map stays in its group at every step, so the end rounds only the
head order: σ maximises ``Σ_g d_g log sinkhorn(S_t)[h, σ(h)]`` plus the permutation members' best block values
(:func:`hard_mixed`, the structured assignment of :func:`lmclab.core.heads.solve_tied`), and each orthogonal
group takes its blocks ``R[h, σ(h)]``.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from lmclab.core.assignment import solve_assignment
from lmclab.core.heads import head_size, headed_permutation, plane_rotations, solve_tied, split_headed, tie_sets
from lmclab.core.orthogonal import POLAR, as_matrix, ones_basis
from lmclab.core.spec import Permutation, PermutationSpec, identity_permutation
from lmclab.search.sinkhorn import (
    hard_permutation,
    headed_soft,
    init_scores,
    scores_at,
    sinkhorn,
    sinkhorn_log,
    soft_permutation,
    tie_key,
    unblock,
)
from lmclab.search.weight_matching import weight_matching
from lmclab.search.wm_orthogonal import orthogonal_groups

Latents = dict[str, Tensor]  # group → the free matrix (headed: one per pair of heads; rotary: the planes' angles)


def start_mixed(
    spec: PermutationSpec,
    params_a: Mapping[str, Tensor],
    params_b: Mapping[str, Tensor],
    *,
    init: str,
    generator: torch.Generator,
    device: torch.device | str,
    lap_backend: str,
) -> tuple[dict[str, Tensor], dict[str, Tensor], Latents]:
    """The scores of :func:`~lmclab.search.sinkhorn.init_scores` (the permutation groups' and the ties'), the
    orthogonal groups' bases and zero latents (:func:`start_latents`); for ``init="wm"`` all at the element of
    weight matching over the mixed group (one start, ``generator`` drawn after the scores): the scores moved to
    its permutations and head orders (:func:`~lmclab.search.sinkhorn.scores_at`), the bases its matrices."""
    sizes = spec.group_sizes(params_a)
    scores = init_scores(sizes, generator, device, spec.heads)
    start = identity_permutation(sizes)
    if init == "wm":
        start = weight_matching(spec, params_a, params_b, generator=generator, lap_backend=lap_backend, restarts=1)
        start = start.perm
    matrix = set(orthogonal_groups(spec))
    scores = {k: v for k, v in scores.items() if k not in matrix or k in spec.heads}
    if init == "wm":  # a headed orthogonal group moves its tie's head scores by its σ (a stand-in: the identity τ)
        moves = {g: _stand_in(g, start[g], spec) if g in matrix else start[g] for g in scores if g in start}
        scores = scores_at(scores, moves, spec.heads)
    kept = {k: v for k, v in scores.items() if k not in matrix}
    bases, latents = start_latents(spec, sizes, start, device)
    return kept, bases, latents


def _stand_in(group: str, element: Tensor, spec: PermutationSpec) -> Tensor:
    """The headed permutation with ``element``'s head order and the identity inside each head."""
    count = spec.heads[group].count
    sigma, _ = split_headed(as_matrix(element).cpu(), count)
    d = len(element) // count
    return headed_permutation(sigma, torch.arange(d).repeat(count, 1))


def start_latents(
    spec: PermutationSpec, sizes: Mapping[str, int], start: Permutation, device: torch.device | str
) -> tuple[dict[str, Tensor], Latents]:
    """The bases ``O₀`` (``R₀``: ``(H, H, d, d)``, the start's block at ``(h, σ(h))``, the identity elsewhere) and
    the zero latents of every orthogonal group (module docstring), from ``start`` (an element of every group), in
    float64 (the search moves them to its dtype)."""
    dtype = torch.float64
    bases, latents = {}, {}
    for g in orthogonal_groups(spec):
        n, kind = sizes[g], spec.kinds[g]
        if g not in spec.heads:
            bases[g] = as_matrix(start[g]).to(device=device, dtype=dtype)
            m = n - 1 if kind == "centred" else n
            latents[g] = torch.zeros(m, m, dtype=dtype, device=device)
            continue
        count = spec.heads[g].count
        d = head_size(g, n, spec.heads[g])
        sigma, blocks = split_headed(as_matrix(start[g]).cpu(), count)
        base = torch.eye(d, dtype=torch.float64).repeat(count, count, 1, 1)
        base[torch.arange(count), sigma] = blocks.double()
        bases[g] = base.to(device=device, dtype=dtype)
        shape = (count, count, d // 2) if kind == "rotary" else (count, count, d, d)
        latents[g] = torch.zeros(shape, dtype=dtype, device=device)
    return bases, latents


def _skew_exp(latent: Tensor) -> Tensor:
    return torch.linalg.matrix_exp(latent - latent.transpose(-2, -1))


def exact_elements(spec: PermutationSpec, bases: Mapping[str, Tensor], latents: Latents) -> dict[str, Tensor]:
    """Every orthogonal group's element at its latent: ``(n, n)`` for a plain group, the ``(H, H, d, d)`` blocks
    ``R[h, h']`` for a headed one (module docstring)."""
    out = {}
    for g, latent in latents.items():
        kind, base = spec.kinds[g], bases[g]
        if kind == "rotary":
            count, _, half = latent.shape
            out[g] = base @ plane_rotations(latent.reshape(-1, half)).reshape(count, count, 2 * half, 2 * half)
        elif kind == "centred":
            h = ones_basis(len(base)).to(base)
            inner = torch.block_diag(base.new_ones(1, 1), _skew_exp(latent))
            out[g] = base @ (h @ inner @ h)
        else:
            out[g] = base @ _skew_exp(latent)
    return out


def soft_mixed(
    spec: PermutationSpec,
    scores: Mapping[str, Tensor],
    bases: Mapping[str, Tensor],
    latents: Latents,
    *,
    tau: float,
    n_iter: int,
) -> dict[str, Tensor]:
    """The ``(E, E)`` matrix of every group: Sinkhorn's soft permutation of a permutation group
    (:func:`~lmclab.search.sinkhorn.soft_permutation`), an orthogonal group's exact element, a headed orthogonal
    group's blocks weighted by its tie's soft head order (module docstring)."""
    soft = soft_permutation(scores, tau=tau, n_iter=n_iter, heads=spec.heads)
    for g, element in exact_elements(spec, bases, latents).items():
        if g in spec.heads:
            element = headed_soft(sinkhorn(scores[tie_key(spec.heads[g].tie)], tau=tau, n_iter=n_iter), element)
        soft[g] = element
    return soft


@torch.no_grad()
def hard_mixed(
    spec: PermutationSpec,
    scores: Mapping[str, Tensor],
    bases: Mapping[str, Tensor],
    latents: Latents,
    *,
    tau: float,
    n_iter: int,
    lap_backend: str = "scipy",
) -> Permutation:
    """The element of every group (module docstring): a permutation group's as
    :func:`~lmclab.search.sinkhorn.hard_permutation`'s, an orthogonal group's exact element (its polar factor,
    which only removes rounding), and per tie of heads σ by the structured assignment, each orthogonal member
    contributing ``d · (log sinkhorn(S_t)[h, h'] + c)`` through the block ``(log sinkhorn(S_t)[h, h'] + c) · R[h,
    h']`` (``c`` makes every weight positive; it adds ``H·d·c`` to every σ), whose best element is ``R[h, h']``."""
    if not latents:
        return hard_permutation(scores, tau=tau, n_iter=n_iter, heads=spec.heads, lap_backend=lap_backend)
    exact = {g: e.double() for g, e in exact_elements(spec, bases, latents).items()}
    ties = {tie_key(heads.tie) for heads in spec.heads.values()}
    plain = {g: s for g, s in scores.items() if g not in spec.heads and g not in ties}
    perm = hard_permutation(plain, tau=tau, n_iter=n_iter, lap_backend=lap_backend)
    perm.update({g: POLAR[spec.kinds[g]](e) for g, e in exact.items() if g not in spec.heads})
    solve = lambda cost: solve_assignment(cost, backend=lap_backend)  # noqa: E731
    for members in tie_sets(spec.heads, spec.heads):
        log_s = sinkhorn_log(scores[tie_key(spec.heads[members[0]].tie)].double(), tau=tau, n_iter=n_iter)
        costs = {}
        for g in members:
            if g in exact:
                costs[g] = unblock((log_s + 1.0 - log_s.min())[:, :, None, None] * exact[g])
            else:
                log_b = sinkhorn_log(scores[g].double(), tau=tau, n_iter=n_iter)
                costs[g] = unblock(log_s[:, :, None, None] + log_b)  # log P_g, as hard_permutation's
        perm.update(solve_tied(costs, spec.heads, solve, spec.kinds))
    return perm
