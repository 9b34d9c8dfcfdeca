"""Soft permutations by Sinkhorn iterations, shared by ``wm_sinkhorn`` and ``ste_sinkhorn``
(Guerrero-Peña et al. 2023, "Re-basin via implicit Sinkhorn differentiation").

Each permutation group ``g`` of size ``n`` gets a free score matrix ``scores[g]: (n, n)``,
initialised at the identity plus seeded Gaussian noise (std 0.1, as in the authors' code).
``S = sinkhorn(scores / τ)`` alternately normalises columns then rows, ``n_iter`` times, in the
authors' order (so the rows of ``S`` sum to 1 exactly and the columns approximately; 20 iterations
at ``τ = 1`` are far from converged for n = 512, so the order is part of the map). ``S[i, j]`` is
the weight of unit ``j`` of θb at position ``i``, so a hard permutation is the matrix with
``S[i, perm[i]] = 1`` and :func:`soft_apply` generalises :func:`lmclab.core.spec.apply_permutation`:
every axis the spec lists is multiplied by its group's ``S`` (``W' = S_ℓ W S_{ℓ-1}ᵀ`` for a dense
layer, kernels on their channel axes, biases, norm parameters and running statistics alike). The
hard permutation is the linear assignment maximising ``Σ_i scores[i, perm[i]]`` (equal to the
assignment on ``S``: Sinkhorn only adds row and column constants to ``scores / τ``).

Two evaluations of the same map. :func:`scaling_sinkhorn` (used when the scores' range allows,
which is every case at ``τ ≈ 1``) iterates the scaling vectors ``S = diag(u) K diag(v)``,
``K = exp(scores / τ)``: one ``exp`` and ``2·n_iter`` matrix-vector products, with a
hand-written backward that is the exact adjoint of those iterations (the unrolled gradient; its
rank-``n_iter`` updates of ``∂K`` are two small matrix products). :func:`log_sinkhorn` runs the
same iterations with ``logsumexp`` and autograd, for ranges where ``exp`` would overflow (small
``τ``). Both are unrolled rather than implicit as in the authors' code: the exact gradient of the
map actually evaluated, needing no converged fixed point. Groups of the same size are batched.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping

import torch
from torch import Tensor

from lmclab.core.spec import Params, Permutation, PermutationSpec, Segment, entry_groups
from lmclab.search.weight_matching import solve_assignment

INIT_NOISE = 0.1  # std of the Gaussian added to the identity initial scores (authors' code)


def refuse_heads(spec: PermutationSpec, method: str) -> None:
    """One-line error when ``spec`` has headed groups (attention): a Sinkhorn matrix over all ``E`` units
    of a group mixes heads, and its hard assignment can cross heads, which changes the function."""
    if spec.heads:
        raise ValueError(
            f"spec: {method} does not search headed groups (attention heads, e.g. {min(spec.heads)!r}); "
            "use wm, am or ste, which solve the headed assignment exactly"
        )


def scaling_max_range(dtype: torch.dtype) -> float:
    """Largest range of ``scores/τ`` evaluated by scaling vectors: they grow like ``exp(range)`` and
    their squares enter the backward, so ``exp(2·range)`` must stay finite (float32: 39.9)."""
    return 0.45 * math.log(torch.finfo(dtype).max)


def log_sinkhorn(scores: Tensor, *, tau: float, n_iter: int) -> Tensor:
    """``exp(log_p)`` after ``n_iter`` column+row normalisations of ``scores/τ`` (…, n, n)."""
    log_p = scores / tau
    for _ in range(n_iter):
        log_p = log_p - torch.logsumexp(log_p, dim=-2, keepdim=True)
        log_p = log_p - torch.logsumexp(log_p, dim=-1, keepdim=True)
    return log_p.exp()


def _vec_mat(vec: Tensor, mat: Tensor) -> Tensor:
    """``vecᵀ mat`` batched (…, n) × (…, n, n) → (…, n): a row vector times a contiguous matrix,
    the fast layout on the CPU (``mat @ vec`` on a batch runs several times slower)."""
    return (vec.unsqueeze(-2) @ mat).squeeze(-2)


class _Scaling(torch.autograd.Function):
    """Column-then-row Sinkhorn on ``K = exp(x − max x)`` (…, n, n) by scaling vectors:
    ``v_t = 1 / (Kᵀ u_{t−1})``, ``u_t = 1 / (K v_t)`` from ``u_0 = 1``; ``S = u_T K v_T``."""

    @staticmethod
    def forward(ctx, x: Tensor, n_iter: int) -> Tensor:  # ctx: the autograd context
        kernel = torch.exp(x - x.detach().amax(dim=(-2, -1), keepdim=True))
        kernel_t = kernel.transpose(-2, -1).contiguous()
        us, vs = [torch.ones(kernel.shape[:-1], dtype=kernel.dtype, device=kernel.device)], []
        for _ in range(n_iter):
            vs.append(1.0 / _vec_mat(us[-1], kernel))  # 1 / (Kᵀ u)
            us.append(1.0 / _vec_mat(vs[-1], kernel_t))  # 1 / (K v)
        ctx.save_for_backward(kernel, kernel_t, torch.stack(us, dim=-2), torch.stack(vs, dim=-2))
        return us[-1].unsqueeze(-1) * kernel * vs[-1].unsqueeze(-2)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        """The adjoint of the iterations: u_t = 1/r_t, r_t = K v_t, v_t = 1/c_t, c_t = Kᵀ u_{t−1}."""
        kernel, kernel_t, us, vs = ctx.saved_tensors  # us: u_0…u_T (…, T+1, n); vs: v_1…v_T (…, T, n)
        grad_k = grad * us[..., -1, :, None] * vs[..., -1, None, :]  # through S = u K v directly
        weighted = grad * kernel
        u_bar = (weighted * vs[..., -1, None, :]).sum(-1)
        v_bar = _vec_mat(us[..., -1, :], weighted)
        r_bars, c_bars = [], []
        for t in range(vs.shape[-2], 0, -1):
            r_bars.append(-u_bar * us[..., t, :] ** 2)
            c_bars.append(-(v_bar + _vec_mat(r_bars[-1], kernel)) * vs[..., t - 1, :] ** 2)
            u_bar, v_bar = _vec_mat(c_bars[-1], kernel_t), 0.0
        r_bars, c_bars = torch.stack(r_bars[::-1], dim=-2), torch.stack(c_bars[::-1], dim=-2)  # t = 1…T
        grad_k = grad_k + r_bars.transpose(-2, -1) @ vs + us[..., :-1, :].transpose(-2, -1) @ c_bars
        return grad_k * kernel, None


def scaling_sinkhorn(scores: Tensor, *, tau: float, n_iter: int) -> Tensor:
    """:func:`log_sinkhorn`'s map evaluated by scaling vectors (exact unrolled gradient)."""
    return _Scaling.apply(scores / tau, n_iter)


def sinkhorn(scores: Tensor, *, tau: float, n_iter: int) -> Tensor:
    """The doubly-stochastic ``S`` of ``scores`` (…, n, n): scaling vectors unless the range of
    ``scores/τ`` exceeds :func:`scaling_max_range`, then the log domain."""
    span = float((scores.detach().amax() - scores.detach().amin()) / tau)
    method = scaling_sinkhorn if span <= scaling_max_range(scores.dtype) else log_sinkhorn
    return method(scores, tau=tau, n_iter=n_iter)


def init_scores(
    sizes: Mapping[str, int], generator: torch.Generator, device: torch.device | str = "cpu"
) -> dict[str, Tensor]:
    """Identity plus ``INIT_NOISE`` · N(0, 1) per group, drawn in sorted group order."""
    return {
        g: (torch.eye(n) + INIT_NOISE * torch.randn(n, n, generator=generator)).to(device)
        for g, n in sorted(sizes.items())
    }


def scores_at(scores: Mapping[str, Tensor], perm: Permutation) -> dict[str, Tensor]:
    """``scores`` with each group's columns reordered so that its diagonal sits at ``perm``:
    ``new[i, perm[i]] = scores[i, i]`` (the identity initialisation moved to the permutation ``perm``,
    whose :func:`hard_permutation` it then is)."""
    return {g: s[:, torch.argsort(perm[g].to(s.device))] for g, s in scores.items()}


def soft_permutation(scores: Mapping[str, Tensor], *, tau: float, n_iter: int) -> dict[str, Tensor]:
    """``sinkhorn`` of every group, groups of the same size in one batched call."""
    by_size: dict[int, list[str]] = defaultdict(list)
    for g, s in scores.items():
        by_size[s.shape[0]].append(g)
    soft: dict[str, Tensor] = {}
    for names in by_size.values():
        batch = sinkhorn(torch.stack([scores[g] for g in names]), tau=tau, n_iter=n_iter)
        soft.update(zip(names, batch.unbind(0), strict=True))
    return {g: soft[g] for g in scores}


def _apply_on_axis(value: Tensor, soft: Tensor, axis: int) -> Tensor:
    moved = value.movedim(axis, 0)  # (n, ...)
    mixed = (soft @ moved.reshape(moved.shape[0], -1)).reshape(moved.shape)
    return mixed.movedim(0, axis)


def _apply_on_segments(value: Tensor, entry: tuple[Segment, ...], soft: Mapping[str, Tensor], axis: int) -> Tensor:
    """A composite axis: each segment mixed by its group's matrix, unit by unit (a unit's block moves whole)."""
    parts, offset = [], 0
    for seg in entry:
        part = value.narrow(axis, offset, seg.length)
        if seg.group is not None:
            moved = part.movedim(axis, 0)
            rows = moved.reshape(seg.length // seg.block, -1)
            part = (soft[seg.group] @ rows).reshape(moved.shape).movedim(0, axis)
        parts.append(part)
        offset += seg.length
    return torch.cat(parts, dim=axis)


def soft_apply(spec: PermutationSpec, soft: Mapping[str, Tensor], params: Mapping[str, Tensor]) -> Params:
    """``π_soft(θ)``: multiply every permuted axis by its group's doubly-stochastic matrix.

    With one-hot rows ``soft[g][i, perm[g][i]] = 1`` this equals ``apply_permutation(spec, perm, θ)``.
    """
    out: Params = {}
    for name, value in params.items():
        for axis, entry in enumerate(spec.axes[name]):
            if isinstance(entry, str):
                value = _apply_on_axis(value, soft[entry], axis)
            elif entry_groups(entry):
                value = _apply_on_segments(value, entry, soft, axis)
        out[name] = value
    return out


@torch.no_grad()
def hard_permutation(scores: Mapping[str, Tensor]) -> Permutation:
    """The permutation maximising ``Σ_i scores[g][i, perm[i]]`` per group (linear assignment)."""
    return {g: solve_assignment(s) for g, s in scores.items()}
