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
assignment on ``log S``: Sinkhorn only adds row and column constants to ``scores / τ``).

Two evaluations of the same map. :func:`scaling_sinkhorn` (used when the scores' range allows,
which is every case at ``τ ≈ 1``) iterates the scaling vectors ``S = diag(u) K diag(v)``,
``K = exp(scores / τ)``: one ``exp`` and ``2·n_iter`` matrix-vector products, with a
hand-written backward that is the exact adjoint of those iterations (the unrolled gradient; its
rank-``n_iter`` updates of ``∂K`` are two small matrix products). :func:`log_sinkhorn` runs the
same iterations with ``logsumexp`` and autograd, for ranges where ``exp`` would overflow (small
``τ``). Both are unrolled rather than implicit as in the authors' code: the exact gradient of the
map actually evaluated, needing no converged fixed point. Matrices of the same size are batched.

Headed groups (attention; :mod:`lmclab.core.heads`) get a soft *headed* permutation: a tie of ``H``
heads has head scores ``S_t: (H, H)`` (key :func:`tie_key`), each of its groups within-head scores
``T_g: (H, H, d, d)`` (one ``d × d`` block per pair of heads), and
``P_g[h·d + j, h'·d + j'] = sinkhorn(S_t)[h, h'] · sinkhorn(T_g[h, h'])[j, j']`` (:func:`headed_soft`),
as doubly stochastic as its factors (rows sum to 1 exactly), and a hard headed permutation exactly
when both factors are permutation matrices.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from functools import partial
from types import MappingProxyType

import torch
from torch import Tensor

from lmclab.core.assignment import solve_assignment
from lmclab.core.heads import Heads, head_size, solve_tied, split_headed, tie_sets
from lmclab.core.spec import Params, Permutation, PermutationSpec, Segment, act_on_copies, entry_groups

INIT_NOISE = 0.1  # std of the Gaussian added to the identity initial scores (authors' code)
NO_HEADS: Mapping[str, Heads] = MappingProxyType({})


def tie_key(tie: str) -> str:
    """The key of the head scores ``S_t`` of tie ``tie`` among the scores (beside the groups' keys)."""
    return f"tie:{tie}"


def scaling_max_range(dtype: torch.dtype) -> float:
    """Largest range of ``scores/τ`` evaluated by scaling vectors: they grow like ``exp(range)`` and
    their squares enter the backward, so ``exp(2·range)`` must stay finite (float32: 39.9)."""
    return 0.45 * math.log(torch.finfo(dtype).max)


def sinkhorn_log(scores: Tensor, *, tau: float, n_iter: int) -> Tensor:
    """``log_p`` after ``n_iter`` column+row normalisations of ``scores/τ`` (…, n, n)."""
    log_p = scores / tau
    for _ in range(n_iter):
        log_p = log_p - torch.logsumexp(log_p, dim=-2, keepdim=True)
        log_p = log_p - torch.logsumexp(log_p, dim=-1, keepdim=True)
    return log_p


def log_sinkhorn(scores: Tensor, *, tau: float, n_iter: int) -> Tensor:
    """``exp`` of :func:`sinkhorn_log`: the map in the log domain, for any range of ``scores/τ``."""
    return sinkhorn_log(scores, tau=tau, n_iter=n_iter).exp()


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


def _noisy_identity(batch: tuple[int, ...], n: int, generator: torch.Generator) -> Tensor:
    """``I + INIT_NOISE · N(0, 1)`` of shape (*batch, n, n)."""
    return torch.eye(n) + INIT_NOISE * torch.randn(*batch, n, n, generator=generator)


def init_scores(
    sizes: Mapping[str, int],
    generator: torch.Generator,
    device: torch.device | str = "cpu",
    heads: Mapping[str, Heads] = NO_HEADS,
) -> dict[str, Tensor]:
    """Identity plus ``INIT_NOISE`` · N(0, 1) per factor: the plain groups first, drawn in sorted group
    order (as for a spec without heads), then per tie (:func:`~lmclab.core.heads.tie_sets` order) ``S_t``
    (H, H) and each of its groups' ``T_g`` (H, H, d, d) in sorted order."""
    scores = {g: _noisy_identity((), n, generator).to(device) for g, n in sorted(sizes.items()) if g not in heads}
    for members in tie_sets(heads, heads):
        count = heads[members[0]].count
        scores[tie_key(heads[members[0]].tie)] = _noisy_identity((), count, generator).to(device)
        for g in members:
            d = head_size(g, sizes[g], heads[g])
            scores[g] = _noisy_identity((count, count), d, generator).to(device)
    return scores


def scores_at(
    scores: Mapping[str, Tensor], perm: Permutation, heads: Mapping[str, Heads] = NO_HEADS
) -> dict[str, Tensor]:
    """``scores`` with each group's columns reordered so that its diagonal sits at ``perm``:
    ``new[i, perm[i]] = scores[i, i]`` (the identity initialisation moved to the permutation ``perm``,
    whose :func:`hard_permutation` it then is). For a headed ``perm = (σ, τ)`` the same reordering of
    the columns of ``P_g`` acts on the factors: ``S_t``'s columns by σ, and the block ``T_g[h, h']``
    moves to ``(h, σ[h'])`` with its columns reordered by ``τ_{h'}`` (so ``T_g[h, h]``'s diagonal sits
    at ``T_g[h, σ[h]][j, τ_h[j]]``)."""
    moved = {g: s[:, torch.argsort(perm[g].to(s.device))] for g, s in scores.items() if g in perm and g not in heads}
    for g in heads:
        split = split_headed(perm[g].cpu(), heads[g].count)
        if split is None:
            raise ValueError(f"perm: the permutation of headed group {g!r} crosses heads")
        inner = torch.argsort(split[1], dim=1).to(scores[g].device)  # (H, d): τ_{h'}⁻¹
        heads_back = torch.argsort(split[0]).to(scores[g].device)  # σ⁻¹
        within = torch.take_along_dim(scores[g], inner[None, :, None, :], dim=3)  # columns of block (h, h') by τ_{h'}
        moved[g] = within[:, heads_back]
        moved[tie_key(heads[g].tie)] = scores[tie_key(heads[g].tie)][:, heads_back]
    return {k: moved[k] for k in scores}


def headed_soft(head: Tensor, within: Tensor) -> Tensor:
    """``P[h·d + j, h'·d + j'] = head[h, h'] · within[h, h', j, j']`` (E, E) from ``head`` (H, H) and
    ``within`` (H, H, d, d).

    Doubly stochastic when both factors are: the row ``h·d + j`` sums to
    ``Σ_{h'} head[h, h'] Σ_{j'} within[h, h'][j, j'] = Σ_{h'} head[h, h'] · 1 = 1``, and a column
    ``h'·d + j'`` to ``Σ_h head[h, h'] Σ_j within[h, h'][j, j'] = 1`` alike. When ``head`` is the
    permutation matrix of σ and each ``within[h, σ[h]]`` that of τ_h, the only nonzero entries are
    ``P[h·d + j, σ[h]·d + τ_h[j]] = 1``: the headed permutation ``(σ, τ)``, and every headed permutation
    is of this form (:func:`lmclab.core.heads.headed_permutation`)."""
    return unblock(head[:, :, None, None] * within)


def unblock(blocks: Tensor) -> Tensor:
    """(H, H, d, d) → (E, E): ``out[h·d + j, h'·d + j'] = blocks[h, h', j, j']``."""
    count, d = blocks.shape[0], blocks.shape[-1]
    return blocks.transpose(1, 2).reshape(count * d, count * d)


def _sinkhorn_batched(scores: Mapping[str, Tensor], *, tau: float, n_iter: int, log: bool = False) -> dict[str, Tensor]:
    """``sinkhorn`` (or :func:`sinkhorn_log`) of every (…, n, n) score tensor, the n×n matrices of one
    size in one batched call; each result has its scores' shape."""
    flat = {k: s.reshape(-1, s.shape[-1], s.shape[-1]) for k, s in scores.items()}
    by_size: dict[int, list[str]] = defaultdict(list)
    for k, s in flat.items():
        by_size[s.shape[-1]].append(k)
    out: dict[str, Tensor] = {}
    for names in by_size.values():
        batch = (sinkhorn_log if log else sinkhorn)(torch.cat([flat[k] for k in names]), tau=tau, n_iter=n_iter)
        out.update(zip(names, batch.split([len(flat[k]) for k in names]), strict=True))
    return {k: out[k].reshape(s.shape) for k, s in scores.items()}


def soft_permutation(
    scores: Mapping[str, Tensor], *, tau: float, n_iter: int, heads: Mapping[str, Heads] = NO_HEADS
) -> dict[str, Tensor]:
    """The (E, E) soft permutation of every group: ``sinkhorn`` of a plain group's scores, the
    :func:`headed_soft` product of its tie's ``sinkhorn(S_t)`` and its blocks ``sinkhorn(T_g[h, h'])``
    for a headed one; matrices of one size in one batched call."""
    soft, ties = _sinkhorn_batched(scores, tau=tau, n_iter=n_iter), _tie_keys(heads)
    return {
        g: headed_soft(soft[tie_key(heads[g].tie)], soft[g]) if g in heads else soft[g] for g in scores if g not in ties
    }


def _tie_keys(heads: Mapping[str, Heads]) -> set[str]:
    return {tie_key(h.tie) for h in heads.values()}


def _apply_on_axis(value: Tensor, soft: Tensor, axis: int) -> Tensor:
    moved = value.movedim(axis, 0)  # (n, ...)
    mixed = (soft @ moved.reshape(moved.shape[0], -1)).reshape(moved.shape)
    return mixed.movedim(0, axis)


def _apply_on_segments(value: Tensor, entry: tuple[Segment, ...], soft: Mapping[str, Tensor], axis: int) -> Tensor:
    """A composite axis: each segment mixed by its group's matrix, unit by unit (a unit's block moves whole)."""
    parts, offset = [], 0
    for seg in entry:
        part = value.narrow(axis, offset, seg.length)
        if seg.group is not None and seg.copies > 1:  # a key/value head's features read once per query head
            part = act_on_copies(part, axis, soft[seg.group], seg)
        elif seg.group is not None:
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
def hard_permutation(
    scores: Mapping[str, Tensor],
    *,
    tau: float,
    n_iter: int,
    heads: Mapping[str, Heads] = NO_HEADS,
    lap_backend: str = "scipy",
) -> Permutation:
    """The permutation maximising ``Σ_i log P_g[i, perm[i]]`` per group, ``P_g`` the soft permutation
    (:func:`soft_permutation`).

    A plain group: the linear assignment on its scores (``log P = scores/τ`` plus row and column
    constants, which no permutation's sum depends on; ``τ`` and ``n_iter`` are unused). A tie: the
    structured assignment :func:`~lmclab.core.heads.solve_tied` on ``log P_g = log S[h, h'] +
    log B_g[h, h'][j, j']`` (float64, log domain), i.e. within each block the assignment on ``T_g[h, h']``
    and σ by ``Σ_g d_g·log S[h, h']`` plus the blocks' best values, whose normalisation constants do
    depend on the head pair. With ``H = 1`` or ``d = 1`` this is the plain rule. The assignments are
    solved by ``lap_backend`` (:mod:`lmclab.core.assignment`)."""
    ties, solve = _tie_keys(heads), partial(solve_assignment, backend=lap_backend)
    perm = {g: solve(s) for g, s in scores.items() if g not in heads and g not in ties}
    if heads:
        headed = {k: s.detach().double() for k, s in scores.items() if k in heads or k in ties}
        log_p = _sinkhorn_batched(headed, tau=tau, n_iter=n_iter, log=True)
        for members in tie_sets(heads, heads):
            log_s = log_p[tie_key(heads[members[0]].tie)]
            costs = {g: unblock(log_s[:, :, None, None] + log_p[g]) for g in members}  # log P_g (E, E)
            perm.update(solve_tied(costs, heads, solve))
    return {g: perm[g] for g in scores if g not in ties}
