"""C2M3: cycle-consistent multi-model matching by Frank–Wolfe (Crisostomi et al., NeurIPS 2024).

Maximise the shared objective (:mod:`lmclab.search.universe`) over doubly-stochastic matrices, one
``P_i^g`` per model i and group g, mapping every model into one universe frame:

    F(P) = Σ_{i<j} ⟨P_i(θ_i), P_j(θ_j)⟩,

``P_i(θ_i)`` the model with every permuted axis multiplied by its group's matrix
(:func:`lmclab.search.sinkhorn.soft_apply`). Each Frank–Wolfe iteration:

1. the gradient ``G_i^g = ∂F/∂P_i^g`` — the weight-matching cost of model i against the sum of the
   others mapped into the universe, ``Σ_{j≠i} P_j(θ_j)`` (autograd, float64);
2. the linear step ``S_i^g = argmax_{permutation} ⟨G_i^g, S⟩``: one assignment per model and group
   (for the headed groups of attention the structured assignment of a tie, which keeps the iterates in
   the hull of headed permutations);
3. the Frank–Wolfe gap ``Σ ⟨G, S − P⟩`` (F is at most this far above the iterate, were it concave);
   stop when it is ≤ ``tol`` · |F|;
4. exact line search along ``P + t (S − P)``, t ∈ [0, 1]: F is a polynomial in t of degree 2k (k the
   most permuted axes of one parameter: 4 for a weight matrix), found from 2k + 1 evaluations; its
   maximum is at an end or a real root of its derivative. The objective never decreases.

Model 0 stays at the identity: F is invariant to one permutation of the universe applied to every
model, so model 0 may fix its order (every permutation solution keeps its value). Left free, all N
models move at once from the identity towards each other's old positions and Frank–Wolfe zig-zags: on
four permuted copies of one MLP it had not reached the planted optimum after 100 iterations, and
reaches it in 5 with model 0 fixed (``tests/search/test_many_models.py``).

At the end each ``P_i^g`` is rounded to the permutation maximising ``⟨P, ·⟩``. Initialisation:
``identity``, ``sinkhorn_barycenter`` (the default; every model but 0 at the barycentre ``J/n`` of
the doubly-stochastic matrices, made unique by a seeded Sinkhorn of small noise) or ``merge_many``
(MergeMany's permutations: does Frank–Wolfe improve on them?).

A group of orthogonal kind (``symmetry="orthogonal"``: the spec's ``kinds``) is relaxed to the convex hull of its
maps, the matrices of spectral norm at most 1 (for a centred group those that also fix the all-ones vector, for a
rotary one those of one ``a I + b J`` per plane): its linear step ``argmax ⟨G, S⟩`` is the polar factor of ``G``
(orthogonal Procrustes, per head and plane inside heads: :func:`lmclab.core.heads.solve_tied`'s exact step, as in
weight matching), its rounding the map nearest to the iterate in that sense, and its barycentre start the
centre of that hull (zero; ``J/n`` for a centred group).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial

import numpy as np
import torch
from numpy.polynomial import polynomial
from torch import Tensor

from lmclab.core.assignment import AssignmentOptions, solve_assignment
from lmclab.core.heads import solve_tied, tie_sets
from lmclab.core.options import Count, NonNegative, OptionError, one_of, option, takes
from lmclab.core.orthogonal import MATRIX_KINDS, as_matrix
from lmclab.core.spec import Permutation, PermutationSpec, entry_groups
from lmclab.search.merge_many import merge_many
from lmclab.search.sinkhorn import sinkhorn, soft_apply
from lmclab.search.universe import UniverseResult, universe_result

INITS = ("identity", "sinkhorn_barycenter", "merge_many")
Soft = list[dict[str, Tensor]]  # per model, per group: a doubly-stochastic matrix


class C2M3Options(AssignmentOptions):
    """Options of :func:`c2m3`."""

    max_iter: Count = option(100, "C2M3: Frank–Wolfe iterations at most")
    tol: NonNegative = option(1.0e-9, "C2M3: stop when the Frank–Wolfe gap is ≤ this fraction of the objective")
    init: one_of(INITS) = option("sinkhorn_barycenter", "C2M3: the start (identity, sinkhorn_barycenter, merge_many)")


def relaxed_objective(spec: PermutationSpec, soft: Soft, params: Sequence[Mapping[str, Tensor]]) -> Tensor:
    """``F(P) = Σ_{i<j} ⟨P_i(θ_i), P_j(θ_j)⟩ = (‖Σ_i A_i‖² − Σ_i ‖A_i‖²) / 2`` over the matched entries."""
    return _objective([soft_apply(spec, s, p) for s, p in zip(soft, params, strict=True)])


def _objective(mapped: Sequence[Mapping[str, Tensor]]) -> Tensor:
    """F of the mapped models ``A_i = P_i(θ_i)`` (:func:`relaxed_objective`)."""
    keys = list(mapped[0])
    total = sum(sum(m[k] for m in mapped).pow(2).sum() for k in keys)
    return (total - sum(m[k].pow(2).sum() for m in mapped for k in keys)) / 2


def _degree(spec: PermutationSpec, keys: Sequence[str]) -> int:
    """The degree in t of F along a segment: twice the most permuted axes of one parameter."""
    return 2 * max(sum(bool(entry_groups(e)) for e in spec.axes[k]) for k in keys)


def _fit(objective, degree: int, at_zero: float | None = None) -> np.ndarray:
    """The exact line search's polynomial: ``objective(t)`` of ``degree`` fitted through degree + 1 points of
    [0, 1]; ``at_zero``, if known, is ``objective(0)`` and saves one evaluation."""
    ts = np.linspace(0.0, 1.0, degree + 1)
    values = [at_zero if t == 0 and at_zero is not None else objective(float(t)) for t in ts]
    return polynomial.polyfit(ts, values, degree)


def _maximum(coef: np.ndarray) -> tuple[float, float]:
    """``(t, value)`` of the polynomial ``coef``'s maximum over [0, 1] (the smallest such t)."""
    roots = polynomial.polyroots(polynomial.polyder(coef)) if len(coef) > 2 else np.array([])
    candidates = [0.0, 1.0] + [float(r.real) for r in roots if abs(r.imag) < 1e-12 and 0 < r.real < 1]
    best = max(candidates, key=lambda t: (polynomial.polyval(t, coef), -t))
    return best, float(polynomial.polyval(best, coef))


Solve = Callable[[Tensor], Tensor]  # a linear assignment solver (lmclab.core.assignment, one backend)


def _vertex(spec: PermutationSpec, grads: Mapping[str, Tensor], solve: Solve) -> dict[str, Tensor]:
    """The linear step: per tie set (a group alone, or the headed groups of one tie) the element maximising
    ``⟨G, S⟩`` of each group's kind, as a matrix (a permutation's 0/1)."""
    out = {}
    for unit in tie_sets(grads, spec.heads):
        found = solve_tied({g: grads[g] for g in unit}, spec.heads, solve, spec.kinds)
        out |= {g: as_matrix(found[g], grads[g].dtype) for g in unit}
    return out


def _round(spec: PermutationSpec, soft: Mapping[str, Tensor], solve: Solve) -> Permutation:
    perm: Permutation = {}
    for unit in tie_sets(soft, spec.heads):
        perm |= solve_tied({g: soft[g] for g in unit}, spec.heads, solve, spec.kinds)
    return perm


def _start(spec, params, sizes, init: str, generator: torch.Generator, lap_backend: str = "scipy") -> Soft:
    eye = {g: torch.eye(n, dtype=torch.float64) for g, n in sizes.items()}
    if init == "identity":
        return [dict(eye) for _ in params]
    if init == "merge_many":
        found = merge_many(spec, params, generator=generator, lap_backend=lap_backend).perms
        return [{g: as_matrix(p[g]) for g in sizes} for p in found]
    bary = {g: _barycentre(spec.kinds.get(g, "permutation"), n, generator) for g, n in sizes.items()}
    return [dict(eye)] + [{g: bary[g].clone() for g in sizes} for _ in params[1:]]


def _barycentre(kind: str, n: int, generator: torch.Generator) -> Tensor:
    """The centre of the relaxed group of ``kind`` (module docstring): doubly-stochastic ``J/n`` made unique by a
    seeded Sinkhorn of small noise for permutations; zero for orthogonal maps, ``J/n`` for centred ones."""
    if kind in MATRIX_KINDS:
        return torch.full((n, n), 1.0 / n, dtype=torch.float64) if kind == "centred" else torch.zeros(n, n).double()
    return sinkhorn(1e-3 * torch.rand(n, n, generator=generator, dtype=torch.float64), tau=1.0, n_iter=200)


def _moved(soft: Soft, direction: Soft, t: float) -> Soft:
    return [{g: s[g] + t * d[g] for g in s} for s, d in zip(soft, direction, strict=True)]


def frank_wolfe_step(
    spec: PermutationSpec,
    soft: Soft,
    matched: Sequence[Mapping[str, Tensor]],
    degree: int,
    solve: Solve = solve_assignment,
    current: float | None = None,
):
    """One iteration at ``soft``: ``(gap, t, direction, value)`` — the Frank–Wolfe gap, the exact step,
    ``S − P`` and F at ``P + t (S − P)`` (module docstring, steps 1–4); ``current`` is F at ``soft``,
    if known. Model 0 stays where it is: its mapped parameters are computed once, outside the gradient."""
    fixed = {k: v.detach() for k, v in soft_apply(spec, soft[0], matched[0]).items()}
    leaves = [{g: m.clone().requires_grad_() for g, m in s.items()} for s in soft[1:]]
    mapped = [fixed] + [soft_apply(spec, s, p) for s, p in zip(leaves, matched[1:], strict=True)]
    flat = iter(torch.autograd.grad(_objective(mapped), [m for s in leaves for m in s.values()]))
    grads = [{g: next(flat) for g in s} for s in leaves]
    direction = [{g: torch.zeros_like(m) for g, m in soft[0].items()}]  # model 0 fixes the universe
    direction += [
        {g: v - s[g] for g, v in _vertex(spec, grad, solve).items()} for grad, s in zip(grads, soft[1:], strict=True)
    ]
    gap = sum(float((grad[g] * d[g]).sum()) for grad, d in zip(grads, direction[1:], strict=True) for g in grad)

    def along(t: float) -> float:
        moved = _moved(soft[1:], direction[1:], t)
        return float(_objective([fixed] + [soft_apply(spec, s, p) for s, p in zip(moved, matched[1:], strict=True)]))

    t, value = _maximum(_fit(along, degree, current))
    return gap, t, direction, value


@takes(C2M3Options)
def c2m3(
    spec: PermutationSpec,
    params: Sequence[Mapping[str, Tensor]],
    *,
    options: C2M3Options,
    generator: torch.Generator | None = None,
) -> UniverseResult:
    """Frank–Wolfe over doubly-stochastic matrices (module docstring; options: :class:`C2M3Options`).
    ``stats``: the relaxed objective after each iteration (``objective``), the gaps, the step sizes,
    ``iterations``, ``assignments``, ``seconds``, and the rounded solution's ``objective_final``."""
    if len(params) < 2:
        raise OptionError(f"{{params}} must name at least 2 models, got {len(params)}")
    start, generator = time.perf_counter(), generator or torch.Generator().manual_seed(0)
    sizes = spec.group_sizes(params[0])
    matched = [{k: v.double() for k, v in spec.matched(p).items()} for p in params]
    degree, per_step = _degree(spec, list(matched[0])), len(params) * len(tie_sets(sizes, spec.heads))
    solve = partial(solve_assignment, backend=options.lap_backend)
    soft = _start(spec, params, sizes, options.init, generator, options.lap_backend)
    trace, gaps, steps = [float(relaxed_objective(spec, soft, matched))], [], []
    for _ in range(options.max_iter):
        gap, t, direction, value = frank_wolfe_step(spec, soft, matched, degree, solve, current=trace[-1])
        gaps.append(gap)
        if gap <= options.tol * abs(trace[-1]) or t == 0.0:  # converged, or no ascent along the direction
            break
        soft = _moved(soft, direction, t)
        steps.append(t)
        trace.append(value)  # F at the new iterate: the fitted polynomial at t (exact to rounding)
    perms = [_round(spec, s, solve) for s in soft]
    stats = {
        "objective": trace,
        "gap": gaps,
        "step": steps,
        "iterations": len(gaps),
        "assignments": per_step * (len(gaps) + 1),  # one linear step per iteration, and the rounding
        "init": options.init,
        "lap_backend": options.lap_backend,
        "seconds": time.perf_counter() - start,
    }
    return universe_result(spec, perms, params, stats)
