"""CCA Merge (Horoi et al. 2024, "Harmony in Diversity: Merging Neural Networks with Canonical
Correlation Analysis"): align every model's features to model 0's by regularised CCA, then average.

For each group, with model 0's features ``z_0`` and model i's ``z_i`` at the group's activation points
(the statistics activation matching reads, :mod:`lmclab.search.features`), covariances ``Σ_00``,
``Σ_ii`` and cross-covariance ``Σ_0i``, CCA finds directions ``P_0``, ``P_i`` maximising the correlation
of ``P_0ᵀ z_0`` and ``P_iᵀ z_i`` subject to ``P_0ᵀ Σ_00 P_0 = P_iᵀ Σ_ii P_i = I``. With the regularised
covariances ``Σ̃ = Σ + γ·(tr Σ / n)·I`` and the SVD of the whitened cross-covariance

    Σ̃_00^{−1/2} Σ_0i Σ̃_ii^{−1/2} = U diag(ρ) Vᵀ      (ρ: the canonical correlations),

``P_0 = Σ̃_00^{−1/2} U`` and ``P_i = Σ̃_ii^{−1/2} V``. The paper's transformation taking model i's
features into model 0's, ``T_i = P_i P_0^{−1}`` (row vectors ``z_0ᵀ ≈ z_iᵀ T_i``), is in the column
convention of :mod:`lmclab.core.transform`

    A_i = T_iᵀ = Σ̃_00^{1/2} U Vᵀ Σ̃_ii^{−1/2},      A_i^{−1} = Σ̃_ii^{1/2} V Uᵀ Σ̃_00^{−1/2},

so ``M_i = A_i / N``, ``U_i = A_i^{−1}`` (model 0: ``M_0 = I/N``, ``U_0 = I``) and the merged model is
the average of all models in model 0's frame, ``θ = (1/N) Σ_i A_i θ_i A_i^{−1}``. If ``z_i = B z_0``
exactly (a planted invertible map) and γ = 0, then ``A_i = B^{−1}``. The authors' code adds ``γ·I`` to
the raw covariances; here γ is relative to the mean variance so that it does not depend on the
activations' scale. The merged network needs REPAIR (:func:`lmclab.search.features.repair_transformed`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn

from lmclab.core.batches import Batches
from lmclab.core.options import Count, NonNegative, Options, option, takes
from lmclab.core.spec import PermutationSpec
from lmclab.core.transform import TransformResult, transform_merge
from lmclab.search.features import check_models, feature_statistics


class CCAOptions(Options):
    """Options of :func:`cca_merge`."""

    gamma: NonNegative = option(1e-4, "CCA Merge: ridge γ added to each covariance, in units of its mean variance")
    batch_size: Count = option(1000, "CCA Merge: inputs per forward pass")
    max_samples: Count | None = option(None, "CCA Merge: training inputs used (null: all)")


def _roots(cov: Tensor, gamma: float) -> tuple[Tensor, Tensor]:
    """``(Σ̃^{1/2}, Σ̃^{−1/2})`` of ``Σ̃ = Σ + γ (tr Σ / n) I`` by the symmetric eigendecomposition."""
    n = cov.shape[0]
    ridge = gamma * cov.diagonal().mean().clamp_min(0) * torch.eye(n, dtype=cov.dtype)
    evals, evecs = torch.linalg.eigh(cov + ridge)
    evals = evals.clamp_min(torch.finfo(cov.dtype).eps * evals.max().clamp_min(1e-300))
    return (evecs * evals.sqrt()) @ evecs.T, (evecs * evals.rsqrt()) @ evecs.T


def cca_map(cov_00: Tensor, cov_ii: Tensor, cov_0i: Tensor, gamma: float) -> tuple[Tensor, Tensor, Tensor]:
    """``(A_i, A_i^{−1}, ρ)``: model i's features into model 0's frame, back, and the canonical
    correlations (module docstring; ``A_i``: ``(n_0, n_i)``)."""
    root_0, inv_root_0 = _roots(cov_00, gamma)
    root_i, inv_root_i = _roots(cov_ii, gamma)
    u, rho, vh = torch.linalg.svd(inv_root_0 @ cov_0i @ inv_root_i, full_matrices=False)
    return root_0 @ u @ vh @ inv_root_i, root_i @ vh.T @ u.T @ inv_root_0, rho


@takes(CCAOptions)
def cca_merge(
    spec: PermutationSpec,
    params: Sequence[Mapping[str, Tensor]],
    *,
    model: nn.Module,
    points: Mapping[str, list[str]],
    data: Batches,
    options: CCAOptions,
) -> TransformResult:
    """Merge ``params`` (N ≥ 2 models) by CCA Merge (module docstring; options: :class:`CCAOptions`).
    ``stats['correlation']``: per group, the mean canonical correlation of each model i ≥ 1 with model 0."""
    groups = list(spec.groups)
    check_models(spec, params, points, groups)
    start, n_models = time.perf_counter(), len(params)
    stats = feature_statistics(
        model,
        params,
        {g: points[g] for g in groups},
        data,
        batch_size=options.batch_size,
        max_samples=options.max_samples,
    )
    merges = [{} for _ in params]
    unmerges = [{} for _ in params]
    correlation = {}
    for g, s in stats.items():
        eye = torch.eye(s.sizes[0], dtype=torch.float64)
        merges[0][g], unmerges[0][g], correlation[g] = eye / n_models, eye, []
        for i in range(1, n_models):
            a, a_inv, rho = cca_map(s.block(0, 0), s.block(i, i), s.block(0, i), options.gamma)
            merges[i][g], unmerges[i][g] = a / n_models, a_inv
            correlation[g].append(float(rho.mean()))
    merged = transform_merge(spec, params, merges, unmerges)
    info = {"seconds": time.perf_counter() - start, "correlation": correlation}
    return TransformResult(merges, unmerges, merged, [], info)
