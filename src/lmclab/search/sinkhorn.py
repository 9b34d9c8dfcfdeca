"""Soft permutations by Sinkhorn iterations, shared by ``wm_sinkhorn`` and ``ste_sinkhorn``
(Guerrero-Peña et al. 2023, "Re-basin via implicit Sinkhorn differentiation"; SPEC.md §3).

Each permutation group ``g`` of size ``n`` gets a free score matrix ``scores[g]: (n, n)``,
initialised at the identity plus seeded Gaussian noise (std 0.1, as in the authors' code).
``S = sinkhorn(scores / τ)`` is doubly stochastic: log-domain iterations alternately normalise
rows and columns with ``logsumexp`` (stable for small ``τ``). ``S[i, j]`` is the weight of unit
``j`` of θb at position ``i``, so a hard permutation is the matrix with ``S[i, perm[i]] = 1`` and
:func:`soft_apply` generalises :func:`lmclab.spec.apply_permutation`: every axis the spec lists
is multiplied by its group's ``S`` (``W' = S_ℓ W S_{ℓ-1}ᵀ`` for a dense layer, kernels on their
channel axes, biases, norm parameters and running statistics alike). The hard permutation is
the linear assignment maximising ``Σ_i scores[i, perm[i]]`` (equal to the assignment on ``S``:
Sinkhorn only adds row and column constants to ``scores / τ``).

Back-propagation through Sinkhorn is **unrolled** (autograd through the ``n_iter`` iterations),
not implicit as in the authors' code: it is the exact gradient of the map actually evaluated,
needs no converged fixed point (20 iterations at ``τ = 1`` are far from converged for n = 512),
and costs ``O(n_iter · n²)`` memory per group, which is a few MB for the paper's widths.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from lmclab.search.options import positive, positive_int
from lmclab.search.weight_matching import solve_assignment
from lmclab.spec import Params, Permutation, PermutationSpec

INIT_NOISE = 0.1  # std of the Gaussian added to the identity initial scores (authors' code)

# options every Sinkhorn method takes
RULES = {"tau": positive, "sinkhorn_iters": positive_int, "lr": positive, "epochs": positive_int}


def log_sinkhorn(scores: Tensor, *, tau: float, n_iter: int) -> Tensor:
    """Doubly-stochastic ``exp(log_p)`` after ``n_iter`` row+column normalisations of ``scores/τ``."""
    log_p = scores / tau  # (n, n)
    for _ in range(n_iter):
        log_p = log_p - torch.logsumexp(log_p, dim=1, keepdim=True)
        log_p = log_p - torch.logsumexp(log_p, dim=0, keepdim=True)
    return log_p.exp()


def init_scores(sizes: Mapping[str, int], generator: torch.Generator,
                device: torch.device | str = "cpu") -> dict[str, Tensor]:
    """Identity plus ``INIT_NOISE`` · N(0, 1) per group, drawn in sorted group order."""
    return {g: (torch.eye(n) + INIT_NOISE * torch.randn(n, n, generator=generator)).to(device)
            for g, n in sorted(sizes.items())}


def soft_permutation(scores: Mapping[str, Tensor], *, tau: float, n_iter: int) -> dict[str, Tensor]:
    return {g: log_sinkhorn(s, tau=tau, n_iter=n_iter) for g, s in scores.items()}


def _apply_on_axis(value: Tensor, soft: Tensor, axis: int) -> Tensor:
    moved = value.movedim(axis, 0)  # (n, ...)
    mixed = (soft @ moved.reshape(moved.shape[0], -1)).reshape(moved.shape)
    return mixed.movedim(0, axis)


def soft_apply(spec: PermutationSpec, soft: Mapping[str, Tensor], params: Mapping[str, Tensor]) -> Params:
    """``π_soft(θ)``: multiply every permuted axis by its group's doubly-stochastic matrix.

    With one-hot rows ``soft[g][i, perm[g][i]] = 1`` this equals ``apply_permutation(spec, perm, θ)``.
    """
    out: Params = {}
    for name, value in params.items():
        for axis, group in enumerate(spec.axes[name]):
            if group is not None:
                value = _apply_on_axis(value, soft[group], axis)
        out[name] = value
    return out


@torch.no_grad()
def hard_permutation(scores: Mapping[str, Tensor]) -> Permutation:
    """The permutation maximising ``Σ_i scores[g][i, perm[i]]`` per group (linear assignment)."""
    return {g: solve_assignment(s) for g, s in scores.items()}
