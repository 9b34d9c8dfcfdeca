"""Joint activation statistics of N models at each group's points, for the transform merges,
and the REPAIR of a transform merge.

The features are read exactly as activation matching reads them
(:mod:`lmclab.search.activation_matching`: forward hooks on the architecture's ``activation_points``,
units on axis 1 or the axis after ``@``, every other position a sample, a group's several points pooled
as more samples), but for the *concatenation* ``z = [z_0; …; z_{N−1}]`` of all N models' features, so
that the full covariance ``Σ = E[z zᵀ] − μ μᵀ`` (float64) holds every within- and cross-model block that
CCA Merge (``Σ_00, Σ_ii, Σ_0i``) and ZipIt! (the correlation of all features) need.

REPAIR of a transform merge (Jordan et al. 2023, generalised): at each repair point (a Linear or
Conv2d with a bias) producing group g, the merged units get the targets

    μ_t = Σ_i M_i μ_i,    σ_t = Σ_i sqrt(diag(M_i Σ_i M_iᵀ)),

the mean and the summed per-unit std of each model's features carried into the merged frame by its
merge matrix (``Σ_i``: model i's covariance at the point; an ungrouped point: ``M_i = w_i I``). For
permutations ``M_i = w_i P_i`` these are REPAIR's ``Σ_i w_i μ_i``, ``Σ_i w_i σ_i`` of the aligned
endpoints (:func:`lmclab.core.repair.repair_merged`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn

from lmclab.core.batches import Batches, input_batches
from lmclab.core.data import Split
from lmclab.core.options import OptionError
from lmclab.core.progress import tick
from lmclab.core.repair import Moments, repair_points, repair_to
from lmclab.core.spec import Params, PermutationSpec
from lmclab.core.transform import TransformResult, merge_weights
from lmclab.search.activation_matching import _record, _units


class FeatureStatistics(NamedTuple):
    """Mean ``(D,)`` and population covariance ``(D, D)`` of the concatenated features of N models
    (``sizes[i]`` features of model i, in model order), over ``samples`` samples; float64."""

    mean: Tensor
    cov: Tensor
    sizes: tuple[int, ...]
    samples: int

    def block(self, i: int, j: int) -> Tensor:
        """``Σ_ij = Cov(z_i, z_j)``, ``(n_i, n_j)``."""
        start = [sum(self.sizes[:k]) for k in range(len(self.sizes) + 1)]
        return self.cov[start[i] : start[i + 1], start[j] : start[j + 1]]

    def correlation(self) -> Tensor:
        """Pearson correlation of every pair of features; a constant feature correlates 0 with all."""
        std = self.cov.diagonal().clamp_min(0).sqrt()
        return self.cov / (torch.outer(std, std) + 1e-12)


@torch.no_grad()
def feature_statistics(
    model: nn.Module,
    params: Sequence[Mapping[str, Tensor]],
    points: Mapping[str, list[str]],
    data: Batches,
    *,
    batch_size: int = 1000,
    max_samples: int | None = None,
) -> dict[str, FeatureStatistics]:
    """The :class:`FeatureStatistics` of every key of ``points`` (a group -> its activation points) over
    the first ``max_samples`` inputs of ``data`` (all: ``None``; a ``DataLoader`` is streamed in one pass),
    in eval mode (the model's mode restored)."""
    all_points = [p for ps in points.values() for p in ps]
    sums: dict[str, list] = {}
    was_training = model.training
    model.eval()
    try:
        for x in input_batches(data, batch_size=batch_size, max_samples=max_samples, like=params[0]):
            tick()  # one batch
            seen = [_record(model, p, all_points, x) for p in params]
            for key, ps in points.items():
                for p in ps:
                    parts = [_units(z[p], p).double() for z in seen]  # (samples, n_i) per model
                    z = torch.cat(parts, 1)
                    acc = sums.setdefault(key, [0, 0.0, 0.0, tuple(q.shape[1] for q in parts)])
                    acc[0], acc[1], acc[2] = acc[0] + z.shape[0], acc[1] + z.sum(0), acc[2] + z.T @ z
    finally:
        model.train(was_training)
    out = {}
    for key, (count, total, outer, sizes) in sums.items():
        mean = total / count
        out[key] = FeatureStatistics(mean, outer / count - torch.outer(mean, mean), sizes, count)
    return out


def check_models(
    spec: PermutationSpec, params: Sequence[Mapping[str, Tensor]], points: Mapping[str, list[str]], groups: list[str]
) -> None:
    """One-line errors of a transform merge's inputs: N ≥ 2 models of the spec, no headed group, a point
    for every group in ``groups``."""
    if len(params) < 2:
        raise OptionError(f"{{params}} must name at least 2 models, got {len(params)}")
    if spec.heads:
        raise ValueError(
            f"group {sorted(spec.heads)[0]!r} is headed: a general linear map would mix attention heads; "
            "merge/unmerge transforms need plain groups"
        )
    for i, p in enumerate(params):
        spec.check(p, f"params[{i}]")
    missing = [g for g in groups if g not in points]
    if missing:
        raise ValueError(f"points: no activation points for the groups {missing}")


def _unit_point(module: nn.Module, name: str) -> str:
    """The activation point of a module's output units (a Conv2d's on axis 1, a Linear's on the last)."""
    return name if isinstance(module, nn.Conv2d) else f"{name}@-1"


def transform_targets(
    model: nn.Module,
    spec: PermutationSpec,
    params: Sequence[Mapping[str, Tensor]],
    merges: Sequence[Mapping[str, Tensor]],
    data: Split,
    *,
    points: list[str] | None = None,
    weights: Sequence[float] | None = None,
    batch_size: int = 500,
) -> dict[str, Moments]:
    """REPAIR's targets ``μ_t``, ``σ_t`` of a transform merge at each point (module docstring; default
    points: :func:`lmclab.core.repair.repair_points`), in forward order."""
    weights = merge_weights(weights, len(params))
    points = repair_points(model, params[0], data, points)
    modules = dict(model.named_modules())
    groups = {p: spec.axes[f"{p}.weight"][0] for p in points}
    for p, g in groups.items():
        if g is not None and not isinstance(g, str):
            raise ValueError(f"points: {p!r} produces a composite axis; REPAIR of a transform needs one group")
    targets = {p: [0.0, 0.0] for p in points}
    for params_i, merge, w in zip(params, merges, weights, strict=True):
        stats = feature_statistics(
            model, [params_i], {p: [_unit_point(modules[p], p)] for p in points}, data, batch_size=batch_size
        )
        for p, g in groups.items():
            s = stats[p]
            m = w * torch.eye(len(s.mean), dtype=torch.float64) if g is None else merge[g].double()
            targets[p][0] = targets[p][0] + m @ s.mean
            targets[p][1] = targets[p][1] + (m @ s.cov @ m.T).diagonal().clamp_min(0).sqrt()
    return {p: Moments(mean, std) for p, (mean, std) in targets.items()}


def repair_transformed(
    model: nn.Module,
    spec: PermutationSpec,
    params: Sequence[Mapping[str, Tensor]],
    result: TransformResult,
    data: Split,
    *,
    points: list[str] | None = None,
    weights: Sequence[float] | None = None,
    batch_size: int = 500,
) -> Params:
    """``result.merged`` with every point rescaled to :func:`transform_targets` on ``data``, in forward
    order (:func:`lmclab.core.repair.repair_to`). BatchNorm networks: recompute their statistics instead
    (:func:`lmclab.core.bn_repair.repair_bn`)."""
    if result.merged is None:
        raise ValueError("result: a partial zip has no single merged model to repair; repair each of its heads")
    targets = transform_targets(
        model, spec, params, result.merges, data, points=points, weights=weights, batch_size=batch_size
    )
    return repair_to(model, result.merged, data, targets, batch_size=batch_size)
