"""Interpolation and merging of two endpoints (the paper's Section 2)."""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor

from lmclab.core.spec import Params, PermutationSpec, apply_permutation


def lerp_params(params_a: Mapping[str, Tensor], params_b: Mapping[str, Tensor], lam: float) -> Params:
    """``θ(λ) = λ θa + (1 − λ) θb`` (the paper's Eq. 1 path); integer buffers (BN counters) are taken from θa."""
    return {k: lam * v + (1 - lam) * params_b[k] if v.is_floating_point() else v.clone() for k, v in params_a.items()}


def aligned_midpoint(
    spec: PermutationSpec, params_a: Mapping[str, Tensor], params_b: Mapping[str, Tensor], perm: Mapping[str, Tensor]
) -> tuple[Params, Params]:
    """``(π(θb), (θa + π(θb)) / 2)``: the aligned endpoint and the merged midpoint model."""
    permuted_b = apply_permutation(spec, perm, params_b)
    return permuted_b, lerp_params(params_a, permuted_b, 0.5)
