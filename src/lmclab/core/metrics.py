"""Metric math as small pure functions (the paper's Definition 2.1 and Section 3). ``λ = 1`` is θa, ``λ = 0`` is θb."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from torch import Tensor

from lmclab.core.options import OptionError
from lmclab.core.spec import PermutationSpec


def lambda_grid(num_lambdas: int) -> list[float]:
    """``num_lambdas`` evenly spaced values in [0, 1], endpoints included, plus ½ if missing."""
    if num_lambdas < 2:
        raise OptionError(f"{{num_lambdas}} must be at least 2 (both endpoints), got {num_lambdas}")
    return sorted(set(np.linspace(0.0, 1.0, num_lambdas).round(12).tolist()) | {0.5})


def _linear_path(lams: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``λ v(θa) + (1 − λ) v(θb)`` with v(θa) = value at λ = 1 and v(θb) at λ = 0."""
    v_a, v_b = values[np.argmax(lams)], values[np.argmin(lams)]
    if not (math.isclose(lams.max(), 1.0) and math.isclose(lams.min(), 0.0)):
        raise ValueError(f"lams: the λ grid must contain both endpoints 0 and 1, got {lams.min():g} to {lams.max():g}")
    return lams * v_a + (1 - lams) * v_b


def barrier(lams: Sequence[float], values: Sequence[float], *, higher_is_better: bool = False) -> float:
    """Definition 2.1: ``max_λ [v(θ(λ)) − (λ v(θa) + (1−λ) v(θb))]`` for a loss; for accuracy
    (``higher_is_better``) the sign is flipped. ≥ 0 on a grid containing the endpoints."""
    lams_arr, vals = np.asarray(lams, float), np.asarray(values, float)
    gap = vals - _linear_path(lams_arr, vals)
    return float((-gap if higher_is_better else gap).max())


def midpoint_barrier(v_mid: float, v_a: float, v_b: float, *, higher_is_better: bool = False) -> float:
    """``B_½ = v((θa+θb)/2) − (v(θa) + v(θb))/2`` (the paper's tables); may be negative."""
    gap = v_mid - (v_a + v_b) / 2
    return float(-gap if higher_is_better else gap)


def l2_distance(spec: PermutationSpec, params_a: Mapping[str, Tensor], params_b: Mapping[str, Tensor]) -> float:
    """``‖θa − θb‖`` over weights and biases (running statistics excluded)."""
    return math.sqrt(
        sum(float((params_a[k].double() - v.double()).pow(2).sum()) for k, v in spec.matched(params_b).items())
    )


def reduction_rate(before: float, after: float) -> float:
    """``(‖θa−θb‖ − ‖θa−π(θb)‖) / ‖θa−θb‖`` in percent."""
    return 100.0 * (before - after) / before if before > 0 else 0.0
