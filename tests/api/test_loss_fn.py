"""``loss_fn=`` in ``curve`` and ``find_permutation``: a regression's loss along the line against its closed
form, accuracy NaN for real-valued targets, and the searches that evaluate a loss calling it."""

from __future__ import annotations

import math

import torch
from torch import nn

import lmclab


def mse(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((out - y) ** 2).mean()


def test_curve_takes_a_regression_loss_and_matches_its_closed_form() -> None:
    torch.manual_seed(0)
    a, b = nn.Linear(3, 2), nn.Linear(3, 2)
    x, y = torch.randn(10, 3), torch.randn(10, 2)
    curve = lmclab.curve(a, b, eval_data=(x, y), lambdas=[0.0, 0.3, 0.5, 1.0], loss_fn=mse)
    rows = {r["lam"]: r for r in curve.rows}
    for lam in (0.0, 0.3, 1.0):  # θ(λ) = λ·θa + (1 − λ)·θb (Eq. 1), a Linear: its output at λ by hand
        weight = lam * a.weight + (1 - lam) * b.weight
        bias = lam * a.bias + (1 - lam) * b.bias
        expected = float(mse(x @ weight.T + bias, y))
        assert math.isclose(rows[lam]["loss"], expected, rel_tol=1e-6) and math.isnan(rows[lam]["acc"])


def test_find_permutation_evaluates_the_search_objective_with_loss_fn() -> None:
    torch.manual_seed(0)
    make = lambda: nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))  # noqa: E731
    a, b = make(), make()
    x, y = torch.randn(32, 4), torch.randn(32, 3)
    calls = []

    def counted(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        calls.append(tuple(target.shape))
        return mse(out, target)

    found = lmclab.find_permutation(
        a, b, method="ste", data=(x, y), options={"epochs": 1, "batch_size": 16}, loss_fn=counted
    )
    assert calls and all(shape[1:] == (3,) for shape in calls) and found.method == "ste"
    calls.clear()
    lmclab.curve(a, b, eval_data=(x, y), num_lambdas=3)  # the custom loss holds inside the call that took it only
    assert not calls
