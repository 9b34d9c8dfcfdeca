"""The linear assignment problem, the inner step of every permutation search: the permutation (or, for
``n < m``, the injection) ``p`` maximising ``Σ_i cost[i, p[i]]``, by one of two exact solvers:

* ``scipy`` — ``scipy.optimize.linear_sum_assignment`` (a shortest augmenting path LAPJV);
* ``lapx`` — ``lap.lapjvr`` of the lapx package (Jonker–Volgenant in float64). On 512² to 2048² random,
  planted and weight-matching costs it reached scipy's optimum at a fraction of its time
  (``benchmarks/bench_lap.py``, docs/methods.md "Assignment solver").

Both are exact, so they reach the same optimal value; where several permutations reach it (ties) they
may return different ones, which is why each method records its ``lap_backend`` in its stats.
:class:`AssignmentOptions` is the one definition of the option, inherited by the options of every method
that solves assignments.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import torch
from pydantic import model_validator
from scipy.optimize import linear_sum_assignment
from torch import Tensor

from lmclab.core.options import OptionError, Options, got, one_of, option

BACKENDS = ("scipy", "lapx")


def solve_assignment(cost: Tensor, backend: str = "scipy") -> Tensor:
    """The ``p`` maximising ``Σ_i cost[i, p[i]]`` for ``cost`` of shape (n, m), n ≤ m: a permutation of
    ``range(n)`` when square, else ``n`` distinct columns (float64; a CPU long tensor of length n)."""
    c = cost.detach().cpu().double().numpy()
    if c.ndim != 2 or c.shape[0] > c.shape[1]:
        raise ValueError(f"cost must be an (n, m) matrix with n ≤ m, got shape {tuple(c.shape)}")
    if not np.isfinite(c).all():
        raise ValueError("cost has NaN or infinite entries")
    if backend == "scipy":
        _, cols = linear_sum_assignment(c, maximize=True)
    elif backend == "lapx":
        _, cols = _lapx().lapjvr(-c, extend_cost=c.shape[0] != c.shape[1], return_cost=False)
    else:
        raise OptionError(f"{{backend}} must be one of {list(BACKENDS)}, got {got(backend)}")
    return torch.from_numpy(np.asarray(cols)).long()  # both return the rows 0, …, n − 1 in order


def _lapx():
    """The lapx package (import name ``lap``), imported on first use."""
    try:
        import lap
    except ImportError:
        raise ModuleNotFoundError("lap_backend 'lapx' needs the lapx package: pip install lapx") from None
    return lap


class AssignmentOptions(Options):
    """The option of every method that solves linear assignments (inherited by its options model)."""

    lap_backend: one_of(BACKENDS) = option(
        "scipy",
        "the linear assignment solver: scipy (linear_sum_assignment) or lapx (lapjvr: the same optimum, faster "
        "on wide groups; ties may break differently)",
    )

    @model_validator(mode="after")
    def _backend_installed(self) -> AssignmentOptions:
        if self.lap_backend == "lapx" and importlib.util.find_spec("lap") is None:
            raise OptionError("{lap_backend} is 'lapx' but the lapx package is not installed (pip install lapx)")
        return self
