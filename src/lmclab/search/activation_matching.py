"""Activation matching, AM (Ainsworth et al. 2023).

``argmin_π Σ_ℓ E‖z^a_ℓ − P_ℓ z^b_ℓ‖²``: independent per permutation group and exact. Expanding
the square, only the cross term depends on ``P``, so each group is a linear assignment on a
similarity of the units' activations over the training data:

* ``statistic="cross_moment"`` (default): ``S = E[z^a z^bᵀ]`` — exactly the objective above.
* ``statistic="pearson"``: the Pearson correlation of units, ``(E[ab] − E[a]E[b]) / (σ_a σ_b)``,
  as in Ainsworth et al.'s code; insensitive to each unit's scale and offset.

Activations are read with forward hooks on the modules the architecture lists in
``activation_points`` (units on axis 1, or on the axis named after ``@`` — ``blocks.0.act@-1`` for
token-major tensors such as a Mixer's; every other position of a feature map counts as a sample; ``[i/n]``
after it: part ``i`` of ``n`` equal parts of that axis, as in a packed ``qkv`` projection; ``:r`` last: the
units are runs of ``r`` consecutive features that move whole, such as heads whose features a rotary embedding
keeps in place, and each feature of a run counts as a sample, so a unit pair's statistic sums its features'
in place: ``S[h, h'] = Σ_j E[z^a_{h,j} z^b_{h',j}]``).
A group with several points (a residual stream) sums their statistics. The headed groups of attention
(queries/keys and values, tied by one head order) sum their costs in one structured assignment that is
exact for this objective (:func:`lmclab.core.heads.solve_tied`). A group the spec marks orthogonal
(:mod:`lmclab.core.orthogonal`) takes ``argmin_O E‖z^a − O z^b‖² = argmax_O ⟨O, E[z^a z^bᵀ]⟩``, the polar factor of
its cross moment (orthogonal Procrustes) — exact too, on the cross moment only; a headed group marked orthogonal,
one head order σ shared with its tie and the polar factor of each head pair's block.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from functools import partial

import torch
from torch import Tensor, nn
from torch.func import functional_call

from lmclab.core.assignment import AssignmentOptions, solve_assignment
from lmclab.core.batches import Batches, input_batches
from lmclab.core.heads import solve_tied, tie_sets
from lmclab.core.options import Count, one_of, option, takes
from lmclab.core.progress import tick
from lmclab.core.spec import PermutationSpec
from lmclab.search.result import SearchResult

STATISTICS = ("cross_moment", "pearson")


class _Moments:
    """Running sums for the cross moment and the Pearson correlation of two unit sets."""

    def __init__(self) -> None:
        self.n = 0
        self.ab = self.a = self.b = self.aa = self.bb = 0.0

    def add(self, a: Tensor, b: Tensor) -> None:  # a, b: (samples, units)
        a, b = a.double(), b.double()
        self.n += a.shape[0]
        self.ab = self.ab + a.T @ b
        self.a, self.b = self.a + a.sum(0), self.b + b.sum(0)
        self.aa, self.bb = self.aa + (a * a).sum(0), self.bb + (b * b).sum(0)

    def similarity(self, statistic: str) -> Tensor:
        cross = self.ab / self.n  # E[a bᵀ], (units, units)
        if statistic == "cross_moment":
            return cross
        mean_a, mean_b = self.a / self.n, self.b / self.n
        std_a = (self.aa / self.n - mean_a**2).clamp_min(0).sqrt()
        std_b = (self.bb / self.n - mean_b**2).clamp_min(0).sqrt()
        cov = cross - torch.outer(mean_a, mean_b)
        return cov / (torch.outer(std_a, std_b) + 1e-12)


def _as_samples(z: Tensor, axis: int = 1) -> Tensor:
    """(batch, …) with the units on ``axis`` -> (every other position, units)."""
    return z.movedim(axis, -1).reshape(-1, z.shape[axis])


def _point(name: str) -> tuple[str, int]:
    """An activation point ``module`` (units on axis 1) or ``module@axis`` (e.g. ``@-1``: the last axis),
    optionally of one part ``[i/n]`` of that axis, optionally in runs ``:r``."""
    module, _, axis = name.split(":")[0].split("[")[0].partition("@")
    return module, int(axis) if axis else 1


def _units(z: Tensor, name: str) -> Tensor:
    """The samples × units of point ``name`` in ``z``: part ``i`` of ``n`` equal parts of the unit axis
    with ``[i/n]`` (timm's packed ``qkv``: ``blocks.0.attn.qkv@-1[2/3]`` holds the values); with ``:r``, one
    unit per run of ``r`` features, each feature of a run another sample (module docstring)."""
    name, _, run = name.partition(":")
    z = _as_samples(z, _point(name)[1])
    if "[" in name:
        i, n = map(int, name.split("[")[1].rstrip("]").split("/"))
        z = z.chunk(n, dim=1)[i]
    if not run:
        return z
    r = int(run)
    return z.reshape(len(z), z.shape[1] // r, r).transpose(1, 2).reshape(-1, z.shape[1] // r)


@torch.no_grad()
def _record(model: nn.Module, params: Mapping[str, Tensor], points: list[str], x: Tensor) -> dict[str, Tensor]:
    seen: dict[str, Tensor] = {}
    modules = dict(model.named_modules())
    hooks = [
        modules[_point(p)[0]].register_forward_hook(lambda _m, _i, out, p=p: seen.__setitem__(p, out)) for p in points
    ]
    try:
        functional_call(model, dict(params), (x,), tie_weights=False)
    finally:
        for h in hooks:
            h.remove()
    return seen


class AMOptions(AssignmentOptions):
    """Options of :func:`activation_matching`."""

    statistic: one_of(STATISTICS) = option(
        "cross_moment", "activation matching: cross_moment = E[a bᵀ] (L2 objective), pearson"
    )
    batch_size: Count = option(1000, "activation matching: images per forward pass")
    max_samples: Count | None = option(None, "activation matching: training images used (null: all)")


@takes(AMOptions)
def activation_matching(
    spec: PermutationSpec,
    params_a: Mapping[str, Tensor],
    params_b: Mapping[str, Tensor],
    *,
    model: nn.Module,
    points: Mapping[str, list[str]],
    data: Batches,
    options: AMOptions,
) -> SearchResult:
    """One exact LAP per group on the activation similarity over ``data`` (a ``Split``, or a
    ``DataLoader`` streamed in one pass: the statistics are sums), in eval mode (options:
    :class:`AMOptions`)."""
    statistic, batch_size, max_samples = options.statistic, options.batch_size, options.max_samples
    if spec.kinds and statistic != "cross_moment":
        raise ValueError(
            f"statistic: {statistic!r} normalises each unit, which an orthogonal map mixes; "
            "orthogonal groups are matched on the cross moment E[a bᵀ] (cross_moment)"
        )
    if set(points) != set(spec.groups):
        raise ValueError(
            f"points: expected activation points of exactly the groups {sorted(spec.groups)}, got {sorted(points)}"
        )
    start = time.perf_counter()
    moments = {g: _Moments() for g in points}
    all_points = [p for ps in points.values() for p in ps]
    model.eval()
    n = 0
    for x in input_batches(data, batch_size=batch_size, max_samples=max_samples, like=params_a):
        tick()  # one batch
        n += len(x)
        za, zb = _record(model, params_a, all_points, x), _record(model, params_b, all_points, x)
        for g, ps in points.items():
            for p in ps:
                moments[g].add(_units(za[p], p), _units(zb[p], p))
    perm = _solve(spec, {g: m.similarity(statistic) for g, m in moments.items()}, options.lap_backend)
    stats = {"seconds": time.perf_counter() - start, "samples": n, "statistic": statistic}
    return SearchResult(perm, stats | {"lap_backend": options.lap_backend})


def _solve(spec: PermutationSpec, similarity: Mapping[str, Tensor], lap_backend: str) -> dict[str, Tensor]:
    """Each group's best element on its similarity: an assignment or, for an orthogonal group, the polar factor
    (headed groups of one tie: one structured solve of either kind, :func:`lmclab.core.heads.solve_tied`)."""
    perm, solve = {}, partial(solve_assignment, backend=lap_backend)
    for unit in tie_sets(similarity, spec.heads):
        perm.update(solve_tied({g: similarity[g] for g in unit}, spec.heads, solve, spec.kinds))
    return perm
