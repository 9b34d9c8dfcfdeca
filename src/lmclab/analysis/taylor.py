"""Taylor-approximated barrier of Theorem 3.1, from gradients and Hessian-vector
products only: the Hessian is never materialised.

With ``θb' = π(θb)``, ``δ = ‖θb' − θa‖`` and ``Δ = (θb' − θa)/δ``, expanding ``L(θ(λ))`` to second
order around θa and around θb' and weighting the two expansions by λ and 1 − λ gives

    B(λ) ≈ λ(1−λ) [ δ Δᵀ(g(θa) − g(θb')) + ½ δ² Δᵀ((1−λ) H(θa) + λ H(θb')) Δ ],

and at λ = ½: ``B_½ ≈ ¼ δ Δᵀ(g_a − g_b) + (1/16) δ² Δᵀ(H_a + H_b) Δ``. The estimate is exact for a
quadratic loss. ``Δᵀ H Δ`` is one forward-over-reverse product (``torch.func.jvp`` of
``torch.func.grad``). The loss is the mean cross-entropy over a split, the model in eval mode,
differentiated with respect to the model's parameters (buffers such as BatchNorm running
statistics are held at each endpoint's own values).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn
from torch.func import grad, jvp

from lmclab.core.data import Split
from lmclab.core.objective import batch_loss
from lmclab.core.spec import Params

LossFn = Callable[[Params], Tensor]


class TaylorTerms(NamedTuple):
    """The ingredients of Theorem 3.1 for one pair on one split."""

    delta: float  # δ = ‖θb' − θa‖
    slope_a: float  # Δᵀ g(θa)
    slope_b: float  # Δᵀ g(θb')
    curvature_a: float  # Δᵀ H(θa) Δ
    curvature_b: float  # Δᵀ H(θb') Δ


def taylor_barrier(terms: TaylorTerms, lam: float) -> float:
    """Theorem 3.1: ``λ(1−λ)[δΔᵀ(g_a − g_b) + ½δ²Δᵀ((1−λ)H_a + λH_b)Δ]`` (λ = 1 is θa)."""
    first = terms.delta * (terms.slope_a - terms.slope_b)
    second = 0.5 * terms.delta**2 * ((1 - lam) * terms.curvature_a + lam * terms.curvature_b)
    return lam * (1 - lam) * (first + second)


def taylor_curve(terms: TaylorTerms, lams: Sequence[float]) -> list[float]:
    """:func:`taylor_barrier` at every λ of the grid."""
    return [taylor_barrier(terms, float(lam)) for lam in lams]


def gradient_and_hvp(
    loss_fn: LossFn, params: Mapping[str, Tensor], direction: Mapping[str, Tensor]
) -> tuple[Params, Params]:
    """``(∇L(θ), ∇²L(θ) v)`` for ``v = direction`` by forward-over-reverse differentiation; only
    the keys of ``direction`` are differentiated, the other entries of ``params`` are constants."""
    names = list(direction)
    fixed = {k: v for k, v in params.items() if k not in direction}

    def loss_of(diff: Params) -> Tensor:
        return loss_fn({**fixed, **diff})

    primals = ({k: params[k] for k in names},)
    tangents = ({k: direction[k].to(params[k]) for k in names},)
    with warnings.catch_warnings():
        # torch's own jvp decomposition table calls the deprecated torch.jit.script when first
        # imported (torch/_decomp/decompositions_for_jvp.py); nothing here uses TorchScript
        warnings.filterwarnings("ignore", message="`torch.jit.script` is deprecated", category=FutureWarning)
        gradient, hvp = jvp(grad(loss_of), primals, tangents)
    return gradient, hvp


def _dot(x: Mapping[str, Tensor], y: Mapping[str, Tensor]) -> float:
    return float(sum((x[k].double() * y[k].double()).sum() for k in x))


def directional_terms(
    loss_fn: LossFn, params: Mapping[str, Tensor], direction: Mapping[str, Tensor]
) -> tuple[float, float]:
    """``(Δᵀ g(θ), Δᵀ H(θ) Δ)`` for the unit direction ``Δ = direction``."""
    gradient, hvp = gradient_and_hvp(loss_fn, params, direction)
    return _dot(direction, gradient), _dot(direction, hvp)


def split_loss_fns(
    model: nn.Module, split: Split, *, batch_size: int = 1000, device: torch.device | str = "cpu"
) -> list[tuple[float, LossFn]]:
    """The mean loss over ``split`` (:mod:`lmclab.core.objective`) as ``Σ_k w_k L_k``: one (weight, loss) per batch."""
    out = []
    for start in range(0, len(split), batch_size):
        x = split.x[start : start + batch_size].to(device)
        y = split.y[start : start + batch_size].to(device)

        def loss_fn(params: Params, x: Tensor = x, y: Tensor = y) -> Tensor:
            return batch_loss(model, params, x, y)

        out.append((len(y) / len(split), loss_fn))
    return out


def taylor_terms(
    model: nn.Module,
    params_a: Mapping[str, Tensor],
    permuted_b: Mapping[str, Tensor],
    split: Split,
    *,
    batch_size: int = 1000,
) -> TaylorTerms:
    """δ, the slopes and curvatures along Δ at θa and θb' for the mean loss over ``split``."""
    device = next(iter(params_a.values())).device
    names = [name for name, _ in model.named_parameters()]
    diff = {k: permuted_b[k] - params_a[k] for k in names}
    delta = math.sqrt(_dot(diff, diff))
    if delta == 0:
        return TaylorTerms(0.0, 0.0, 0.0, 0.0, 0.0)
    unit = {k: v / delta for k, v in diff.items()}
    was_training = model.training
    model.eval()
    sums = [0.0, 0.0, 0.0, 0.0]
    for weight, loss_fn in split_loss_fns(model, split, batch_size=batch_size, device=device):
        for i, params in enumerate((params_a, permuted_b)):
            slope, curvature = directional_terms(loss_fn, dict(params), unit)
            sums[i] += weight * slope
            sums[2 + i] += weight * curvature
    model.train(was_training)
    return TaylorTerms(delta, sums[0], sums[1], sums[2], sums[3])
