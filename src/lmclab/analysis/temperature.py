"""The barrier with each model's softmax temperature calibrated: the control of Ito, Yamada, Chijiwa & Kumagai
(2025, *Do We Really Need Permutations? Impact of Model Width on Linear Mode Connectivity*), who find wide
models linearly connected without any permutation once the interpolated model's temperature is calibrated.

Averaging two models' weights shrinks the merged model's logits (its units no longer agree), so part of a loss
barrier is a miscalibrated scale rather than wrong predictions. For a model θ, the calibrated temperature is
``T(θ) = argmin_T L(f_θ(x) / T)`` on a calibration split (the cross-entropy of the scaled logits; one scalar,
found by a bounded search over ``log T``), and its calibrated loss is the test loss at ``T(θ)``. The calibrated
barrier at λ = ½ is ``L_T(θ(½)) − (L_T(θa) + L_T(θb)) / 2``, each model at its own temperature (so the
endpoints are calibrated too and the barrier compares like with like); accuracy does not depend on ``T``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from scipy.optimize import minimize_scalar
from torch import Tensor, nn
from torch.func import functional_call

from lmclab.core.data import Split, inputs_like
from lmclab.core.merge import lerp_params
from lmclab.core.objective import logits_of

LOG_T_BOUNDS = (math.log(1e-2), math.log(1e2))  # the temperatures searched, 0.01 to 100


@torch.no_grad()
def logits_on(model: nn.Module, params: Mapping[str, Tensor], split: Split, *, batch_size: int = 256) -> Tensor:
    """The logits of ``model`` run with ``params`` (eval mode, the caller's mode restored) on ``split``, one row
    per prediction (a class per position: every position), float32 on the CPU."""
    was_training, rows = model.training, []
    model.eval()
    try:
        for start in range(0, len(split), batch_size):
            x = inputs_like(split.x[start : start + batch_size], params)
            out = logits_of(functional_call(model, dict(params), (x,), tie_weights=False))
            rows.append(out.reshape(-1, out.shape[-1]).float().cpu())
    finally:
        model.train(was_training)
    return torch.cat(rows)


def calibrated_temperature(logits: Tensor, y: Tensor) -> float:
    """``argmin_T`` of the mean cross-entropy of ``logits / T`` against the labels ``y`` (flattened alike)."""
    y = y.reshape(-1).cpu()

    def loss(log_t: float) -> float:
        return float(F.cross_entropy(logits / math.exp(log_t), y))

    found = minimize_scalar(loss, bounds=LOG_T_BOUNDS, method="bounded", options={"xatol": 1e-7})
    return math.exp(found.x)


def calibrated_loss(
    model: nn.Module, params: Mapping[str, Tensor], calibrate: Split, test: Split
) -> tuple[float, float]:
    """``(T, loss)``: the temperature calibrated on ``calibrate`` and the test loss at it (module docstring)."""
    t = calibrated_temperature(logits_on(model, params, calibrate), calibrate.y)
    return t, float(F.cross_entropy(logits_on(model, params, test) / t, test.y.reshape(-1).cpu()))


def calibrated_barrier(
    model: nn.Module, params_a: Mapping[str, Tensor], params_b: Mapping[str, Tensor], calibrate: Split, test: Split
) -> dict[str, float]:
    """The calibrated test-loss barrier at λ = ½ between ``params_a`` and ``params_b`` (e.g. π(θb)) and the three
    temperatures (module docstring): ``test_loss_barrier_mid_calibrated``, ``temperature_a``, ``temperature_b``,
    ``temperature_mid``."""
    found = {
        name: calibrated_loss(model, params, calibrate, test)
        for name, params in (("a", params_a), ("b", params_b), ("mid", lerp_params(params_a, params_b, 0.5)))
    }
    barrier = found["mid"][1] - (found["a"][1] + found["b"][1]) / 2
    return {"test_loss_barrier_mid_calibrated": barrier} | {f"temperature_{k}": t for k, (t, _) in found.items()}
