"""The linear assignment problem, the inner step of every permutation search: the permutation (or, for
``n < m``, the injection) ``p`` maximising ``Σ_i cost[i, p[i]]``, by one of two exact solvers:

* ``scipy`` — ``scipy.optimize.linear_sum_assignment`` (a shortest augmenting path LAPJV);
* ``lapx`` — ``lap.lapjvr`` of the lapx package (Jonker–Volgenant in float64). On 512² to 2048² random,
  planted and weight-matching costs it reached scipy's optimum at a fraction of its time
  (``benchmarks/bench_lap.py``, docs/methods.md "Assignment solver").

Both are exact, so they reach the same optimal value; where several permutations reach it (ties) they
may return different ones, which is why each method records its ``lap_backend`` in its stats.

``auto`` (the default) is ``lapx`` wherever the package is installed (a core dependency of lmclab), else
``scipy``: in ``benchmarks/bench_lap.py``'s results lapx took a fraction of scipy's time on random,
tie-heavy, planted and weight-matching costs from 512² to 2048², and less over a whole WM search; the
one matrix on which it was slower is a trained pair's first WM cost at 2048² (docs/methods.md,
"Assignment solver"). An options model resolves ``auto`` when it is validated, so stats name the solver
that ran.
:class:`AssignmentOptions` is the one definition of the option, inherited by the options of every method
that solves assignments.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import torch
from pydantic import field_validator, model_validator
from scipy.optimize import linear_sum_assignment
from torch import Tensor

from lmclab.core.options import OptionError, Options, got, one_of, option

BACKENDS = ("scipy", "lapx")
AUTO = "auto"


def resolve_backend(backend: str) -> str:
    """``backend``, with ``auto`` resolved (module docstring)."""
    if backend != AUTO:
        return backend
    return "lapx" if importlib.util.find_spec("lap") is not None else "scipy"


def solve_assignment(cost: Tensor, backend: str = "scipy") -> Tensor:
    """The ``p`` maximising ``Σ_i cost[i, p[i]]`` for ``cost`` of shape (n, m), n ≤ m: a permutation of
    ``range(n)`` when square, else ``n`` distinct columns (float64; a CPU long tensor of length n)."""
    backend = resolve_backend(backend)
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
        raise OptionError(f"{{backend}} must be one of {[AUTO, *BACKENDS]}, got {got(backend)}")
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

    lap_backend: one_of((AUTO, *BACKENDS)) = option(
        AUTO,
        "the linear assignment solver: scipy (linear_sum_assignment), lapx (lapjvr: the same optimum, faster; "
        "ties may break differently) or auto (lapx where installed, else scipy)",
        validate_default=True,  # auto resolved in every options model, given or not
    )

    @field_validator("lap_backend")
    @classmethod
    def _resolve(cls, backend: str) -> str:
        return resolve_backend(backend)

    @model_validator(mode="after")
    def _backend_installed(self) -> AssignmentOptions:
        if self.lap_backend == "lapx" and importlib.util.find_spec("lap") is None:
            raise OptionError("{lap_backend} is 'lapx' but the lapx package is not installed (pip install lapx)")
        return self
