"""REPAIR for networks without BatchNorm (Jordan et al. 2023, "REPAIR: REnormalizing Permuted
Activations for Interpolation Repair"): LayerNorm ViTs and Mixers, plain MLPs.

In the interpolated network ``θ(λ) = λ θa + (1 − λ) π(θb)`` (the project's convention of
:func:`lmclab.core.merge.lerp_params`: λ = 1 is θa, λ = 0 is π(θb); the paper's α is our 1 − λ)
the pre-activations of aligned units lose variance ("variance collapse"). REPAIR gives each unit of
each repair point the interpolation of the endpoints' statistics (Jordan et al. 2023, the REPAIR
targets: E[X_α] = (1−α) E[X_1] + α E[X_2], std(X_α) = (1−α) std(X_1) + α std(X_2)):

    μ_t = λ μ_a + (1 − λ) μ_b,    σ_t = λ σ_a + (1 − λ) σ_b,

by an affine correction of the point's own layer (row-wise, ``s = σ_t / σ_m``):

    W ← s · W,    b ← s · (b − μ_m) + μ_t,

so that its output ``y' = s (y − μ_m) + μ_t`` has mean μ_t and std σ_t on the repair data.
Statistics are per unit over every sample and every other position: units on the last axis of a
Linear's output (tokens pooled), on axis 1 of a Conv2d's output (pixels pooled); the std is the
population std (the ratio σ_t/σ_m does not depend on that choice). A correction upstream changes
every statistic downstream, so the points are repaired one at a time in forward order, the merged
network measured again before each. A unit that is constant on the data (σ_m = 0: a dead unit)
cannot be rescaled: only its mean is moved to μ_t. Parameters are never mutated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn
from torch.func import functional_call

from lmclab.core.data import Split, inputs_like
from lmclab.core.merge import lerp_params
from lmclab.core.spec import Params

DEAD = 64  # σ_m ≤ DEAD · eps · |μ_m| is a constant unit: float rounding, not a distribution


class Moments(NamedTuple):
    """Per-unit ``mean`` and population ``std`` of one repair point, float64 ``(units,)``."""

    mean: Tensor
    std: Tensor


def _unit_axis(module: nn.Module) -> int:
    return 1 if isinstance(module, nn.Conv2d) else -1


def _batches(data: Split, params: Mapping[str, Tensor], batch_size: int):
    for start in range(0, len(data), batch_size):
        yield inputs_like(data.x[start : start + batch_size], params)


@torch.no_grad()
def _run_hooked(model: nn.Module, params: Mapping[str, Tensor], inputs, names: list[str], record) -> None:
    """Run ``model`` with ``params`` in eval mode on every input, calling ``record(name, output)``."""
    modules = dict(model.named_modules())
    hooks = [modules[n].register_forward_hook(lambda _m, _i, out, n=n: record(n, out)) for n in names]
    was_training = model.training
    model.eval()
    try:
        for x in inputs:
            functional_call(model, dict(params), (x,), tie_weights=False)
    finally:
        model.train(was_training)
        for h in hooks:
            h.remove()


def forward_order(model: nn.Module, params: Mapping[str, Tensor], data: Split) -> list[str]:
    """Every Linear and Conv2d of ``model`` in the order they first run on one input."""
    names = [n for n, m in model.named_modules() if isinstance(m, nn.Linear | nn.Conv2d)]
    order: dict[str, None] = {}
    _run_hooked(
        model, params, _batches(Split(data.x[:1], data.y[:1]), params, 1), names, lambda n, _o: order.setdefault(n)
    )
    return list(order)


def repair_points(
    model: nn.Module, params: Mapping[str, Tensor], data: Split, points: list[str] | None = None
) -> list[str]:
    """``points`` (module names) checked and put in forward order; by default every Linear and Conv2d
    with a bias except the last one to run (the classifier: its logits are the output, not a
    hidden unit feeding a nonlinearity or the residual stream)."""
    order, modules = forward_order(model, params, data), dict(model.named_modules())
    if points is None:
        return [n for n in order[:-1] if modules[n].bias is not None]
    for p in points:
        if p not in order or modules[p].bias is None:
            raise ValueError(f"points: {p!r} is not a Linear or Conv2d with a bias that runs in the forward pass")
    return [n for n in order if n in set(points)]


def unit_statistics(
    model: nn.Module, params: Mapping[str, Tensor], data: Split, points: list[str], *, batch_size: int = 500
) -> dict[str, Moments]:
    """Per-unit mean and std of every point's output over ``data`` (Chan's pairwise update in float64)."""
    modules = dict(model.named_modules())
    acc: dict[str, tuple[int, Tensor, Tensor]] = {}

    def record(name: str, out: Tensor) -> None:
        z = out.movedim(_unit_axis(modules[name]), -1).reshape(-1, out.shape[_unit_axis(modules[name])]).double()
        nb, mb = z.shape[0], z.mean(0)
        m2b = (z - mb).square().sum(0)
        n, mean, m2 = acc.get(name, (0, torch.zeros_like(mb), torch.zeros_like(mb)))
        delta, total = mb - mean, n + nb
        acc[name] = (total, mean + delta * nb / total, m2 + m2b + delta.square() * n * nb / total)

    _run_hooked(model, params, _batches(data, params, batch_size), points, record)
    return {p: Moments(acc[p][1], (acc[p][2] / acc[p][0]).sqrt()) for p in points}


def target_statistics(stats_a: Mapping[str, Moments], stats_b: Mapping[str, Moments], lam: float) -> dict[str, Moments]:
    """REPAIR's targets ``μ_t = λ μ_a + (1−λ) μ_b``, ``σ_t = λ σ_a + (1−λ) σ_b`` (module docstring)."""
    return {
        p: Moments(lam * a.mean + (1 - lam) * stats_b[p].mean, lam * a.std + (1 - lam) * stats_b[p].std)
        for p, a in stats_a.items()
    }


def rescale(params: Mapping[str, Tensor], point: str, merged: Moments, target: Moments) -> Params:
    """``W ← s W``, ``b ← s (b − μ_m) + μ_t`` with ``s = σ_t / σ_m`` per output unit; a constant unit
    (σ_m = 0) keeps ``s = 1``, its mean alone moved to μ_t (never a NaN)."""
    weight, bias = params[f"{point}.weight"], params[f"{point}.bias"]
    dead = merged.std <= DEAD * torch.finfo(weight.dtype).eps * merged.mean.abs()
    scale = torch.where(dead, 1.0, target.std / merged.std.where(~dead, 1.0))  # (out,)
    new_bias = scale * (bias.double() - merged.mean) + target.mean
    shape = (-1,) + (1,) * (weight.dim() - 1)
    return {
        **params,
        f"{point}.weight": weight * scale.to(weight).view(shape),
        f"{point}.bias": new_bias.to(bias),
    }


def repair_to(
    model: nn.Module,
    params: Mapping[str, Tensor],
    data: Split,
    targets: Mapping[str, Moments],
    *,
    batch_size: int = 500,
) -> Params:
    """``params`` with each point of ``targets`` (module names, in forward order) rescaled so that its
    units have the target mean and std on ``data`` (:func:`rescale`), one point at a time: each
    measurement sees every correction upstream of it. One pass over ``data`` per point."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be a positive number of samples, got {batch_size}")
    params = dict(params)
    for p, target in targets.items():
        merged = unit_statistics(model, params, data, [p], batch_size=batch_size)[p]
        params = rescale(params, p, merged, target)
    return params


def repair_interpolated(
    model: nn.Module,
    params_a: Mapping[str, Tensor],
    params_b: Mapping[str, Tensor],
    lam: float,
    data: Split,
    *,
    points: list[str] | None = None,
    batch_size: int = 500,
) -> Params:
    """The REPAIRed ``θ(λ) = λ θa + (1 − λ) θb`` (θb: the aligned π(θb)); ``points``: module names
    (default :func:`repair_points`). One pass per endpoint, then one per point, over ``data``."""
    if not 0 <= lam <= 1:
        raise ValueError(f"lam must be in [0, 1], got {lam}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be a positive number of samples, got {batch_size}")
    points = repair_points(model, params_a, data, points)
    stats_a = unit_statistics(model, params_a, data, points, batch_size=batch_size)
    stats_b = unit_statistics(model, params_b, data, points, batch_size=batch_size)
    targets = target_statistics(stats_a, stats_b, lam)
    return repair_to(model, lerp_params(params_a, params_b, lam), data, targets, batch_size=batch_size)


def merged_targets(
    model: nn.Module,
    aligned: Sequence[Mapping[str, Tensor]],
    data: Split,
    *,
    weights: Sequence[float] | None = None,
    points: list[str] | None = None,
    batch_size: int = 500,
) -> tuple[list[float], dict[str, Moments]]:
    """The checked ``weights`` (default 1/N each, non-negative, summing to 1) and REPAIR's targets of the
    merge of N endpoints in one frame: ``μ_t = Σ_i w_i μ_i``, ``σ_t = Σ_i w_i σ_i`` at every point (the
    pair's targets with weights (λ, 1 − λ)). One pass per endpoint over ``data``."""
    if len(aligned) < 1:
        raise ValueError("aligned must hold at least one model, got none")
    if batch_size < 1:
        raise ValueError(f"batch_size must be a positive number of samples, got {batch_size}")
    weights = [1 / len(aligned)] * len(aligned) if weights is None else [float(w) for w in weights]
    if len(weights) != len(aligned) or min(weights) < 0 or abs(sum(weights) - 1) > 1e-9:
        raise ValueError(f"weights must be {len(aligned)} non-negative numbers summing to 1, got {weights}")
    points = repair_points(model, aligned[0], data, points)
    stats = [unit_statistics(model, p, data, points, batch_size=batch_size) for p in aligned]
    targets = {
        p: Moments(*(sum(w * s[p][f] for w, s in zip(weights, stats, strict=True)) for f in (0, 1))) for p in points
    }
    return weights, targets


def repair_merged(
    model: nn.Module,
    aligned: Sequence[Mapping[str, Tensor]],
    data: Split,
    *,
    weights: Sequence[float] | None = None,
    points: list[str] | None = None,
    batch_size: int = 500,
) -> Params:
    """REPAIR of the merge of N endpoints already in one frame (MergeMany, C2M3, …): ``θ = Σ_i w_i θ_i``
    with each point's units set to :func:`merged_targets`. The endpoints' statistics must be those of the
    *aligned* models: unaligned endpoints put a unit's target on other units' statistics. One pass per
    endpoint and one per point over ``data``."""
    weights, targets = merged_targets(model, aligned, data, weights=weights, points=points, batch_size=batch_size)
    merged = {
        k: sum(w * p[k] for w, p in zip(weights, aligned, strict=True)) if v.is_floating_point() else v.clone()
        for k, v in aligned[0].items()
    }
    return repair_to(model, merged, data, targets, batch_size=batch_size)


class RepairAt:
    """REPAIR as the measure's ``repair_at`` (:func:`lmclab.core.interpolation.interpolation_curve`):
    ``repair_at(θa, θb, λ)`` is :func:`repair_interpolated`'s θ(λ) on ``data``, with the endpoints' statistics measured
    once per pair of endpoints (a curve's λ share them) and the points found once."""

    def __init__(self, model: nn.Module, data: Split, *, points: list[str] | None = None, batch_size: int = 500):
        if batch_size < 1:
            raise ValueError(f"batch_size must be a positive number of samples, got {batch_size}")
        self.model, self.data, self.points, self.batch_size = model, data, points, batch_size
        self._endpoints: tuple = ()  # (θa, θb, points, their targets' inputs): the last pair seen

    def _statistics(self, params_a: Mapping[str, Tensor], params_b: Mapping[str, Tensor]):
        if not (self._endpoints and self._endpoints[0] is params_a and self._endpoints[1] is params_b):
            points = repair_points(self.model, params_a, self.data, self.points)
            stats = (
                unit_statistics(self.model, p, self.data, points, batch_size=self.batch_size)
                for p in (params_a, params_b)
            )
            self._endpoints = (params_a, params_b, points, *stats)
        return self._endpoints[2:]

    def __call__(self, params_a: Mapping[str, Tensor], params_b: Mapping[str, Tensor], lam: float) -> Params:
        if not 0 <= lam <= 1:
            raise ValueError(f"lam must be in [0, 1], got {lam}")
        points, stats_a, stats_b = self._statistics(params_a, params_b)
        targets = target_statistics(stats_a, stats_b, lam)
        return repair_to(
            self.model, lerp_params(params_a, params_b, lam), self.data, targets, batch_size=self.batch_size
        )
