"""Interpolation and merging of two endpoints (the paper's Section 2).

>>> import torch
>>> from lmclab.core.spec import PermutationSpec
>>> a, b = {"w": torch.tensor([1.0, 2.0])}, {"w": torch.tensor([4.0, 3.0])}
>>> lerp_params(a, b, 0.25)["w"]                       # λ = 1: θa, λ = 0: θb
tensor([3.2500, 2.7500])
>>> spec = PermutationSpec({"w": ("P",)})                   # axis 0 of w: group P
>>> permuted_b, midpoint = aligned_midpoint(spec, a, b, {"P": torch.tensor([1, 0])})
>>> permuted_b["w"], midpoint["w"]
(tensor([3., 4.]), tensor([2., 3.]))
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor

from lmclab.core.options import OptionError
from lmclab.core.spec import Params, PermutationSpec, apply_permutation


def check_lam(lam: float) -> float:
    """``lam`` if it is a λ of the segment between the endpoints, [0, 1]; an :class:`OptionError` naming it."""
    if not 0.0 <= lam <= 1.0:
        raise OptionError(f"{{lam}} must be in [0, 1], got {lam}")
    return lam


def lerp_params(params_a: Mapping[str, Tensor], params_b: Mapping[str, Tensor], lam: float) -> Params:
    """``θ(λ) = λ θa + (1 − λ) θb`` (the paper's Eq. 1 path); integer buffers (BN counters) are taken from θa."""
    return {k: lam * v + (1 - lam) * params_b[k] if v.is_floating_point() else v.clone() for k, v in params_a.items()}


def aligned_midpoint(
    spec: PermutationSpec, params_a: Mapping[str, Tensor], params_b: Mapping[str, Tensor], perm: Mapping[str, Tensor]
) -> tuple[Params, Params]:
    """``(π(θb), (θa + π(θb)) / 2)``: the aligned endpoint and the merged midpoint model."""
    permuted_b = apply_permutation(spec, perm, params_b)
    return permuted_b, lerp_params(params_a, permuted_b, 0.5)
