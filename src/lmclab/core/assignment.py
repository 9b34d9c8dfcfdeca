"""The linear assignment problem, the inner step of every permutation search: the permutation (or, for
``n < m``, the injection) ``p`` maximising ``Σ_i cost[i, p[i]]``, by one of two exact solvers:

* ``scipy`` — ``scipy.optimize.linear_sum_assignment`` (a shortest augmenting path LAPJV);
* ``lapx`` — ``lap.lapjvr`` of the lapx package (Jonker–Volgenant in float64). On 512² to 2048² random,
  planted and weight-matching costs it reached scipy's optimum at a fraction of its time
  (``benchmarks/bench_lap.py``, docs/methods.md "Assignment solver").

Both are exact, so they reach the same optimal value; where several permutations reach it (ties) they
may return different ones, which is why each method records its ``lap_backend`` in its stats.

``auto`` (the default) picks per assignment, by its width ``n`` (the larger side): ``lapx`` below
:data:`AUTO_SCIPY_FROM` units and ``scipy`` from there, or ``scipy`` everywhere when lapx is not installed.
In ``benchmarks/bench_lap.py``'s results lapx took a fraction of scipy's time on random, tie-heavy, planted and
weight-matching costs from 512² to 2048²; in ``benchmarks/bench_lap_widths.py``'s, at the widths of language
models' groups, its lead shrinks with ``n`` and is gone by 11,008 (docs/performance.md, "Assignments at
language-model widths"). Both solvers run on the CPU: a cost on a GPU is copied to it, as no GPU solver
was measured faster. An options model keeps ``auto`` (``scipy`` when lapx is missing), and every search
counts the assignments each solver ran (``stats['lap_solves']``, :func:`counting_solves`), so stats name the
solvers that ran.
:class:`AssignmentOptions` is the one definition of the option, inherited by the options of every method
that solves assignments.
"""

from __future__ import annotations

import importlib.util
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import numpy as np
import torch
from pydantic import field_validator, model_validator
from scipy.optimize import linear_sum_assignment
from torch import Tensor

from lmclab.core.options import OptionError, Options, got, one_of, option

BACKENDS = ("scipy", "lapx")
AUTO = "auto"


AUTO_SCIPY_FROM = 10_000  # units: the width from which ``auto`` picks scipy (module docstring)
_SOLVES: ContextVar[Counter[str] | None] = ContextVar("lmclab_solves", default=None)


def resolve_backend(backend: str, n: int | None = None) -> str:
    """``backend`` with ``auto`` resolved for an assignment of width ``n`` (module docstring); with ``n``
    None, what ``auto`` means before the width is known: ``auto`` where lapx is installed, else ``scipy``."""
    if backend != AUTO:
        return backend
    if importlib.util.find_spec("lap") is None:
        return "scipy"
    if n is None:
        return AUTO
    return "lapx" if n < AUTO_SCIPY_FROM else "scipy"


@contextmanager
def counting_solves() -> Iterator[Counter[str]]:
    """The number of assignments each solver ran inside the block (solver -> count); a block inside another
    adds its counts to the outer one's."""
    counts: Counter[str] = Counter()
    token = _SOLVES.set(counts)
    try:
        yield counts
    finally:
        _SOLVES.reset(token)
        outer = _SOLVES.get()
        if outer is not None:
            outer.update(counts)


def solves_stat(options: Options, solves: Counter[str]) -> dict[str, dict[str, int]]:
    """``{'lap_solves': solver -> count}`` from :func:`counting_solves`' ``solves`` when ``options`` (a
    method's) take ``lap_backend``, else nothing: the stat by which a search names the solvers that ran."""
    if "lap_backend" not in type(options).model_fields:
        return {}
    return {"lap_solves": {solver: solves[solver] for solver in sorted(solves)}}


def solve_assignment(cost: Tensor, backend: str = "scipy") -> Tensor:
    """The ``p`` maximising ``Σ_i cost[i, p[i]]`` for ``cost`` of shape (n, m), n ≤ m: a permutation of
    ``range(n)`` when square, else ``n`` distinct columns (float64; a CPU long tensor of length n)."""
    c = cost.detach().cpu().double().numpy()
    if c.ndim != 2 or c.shape[0] > c.shape[1]:
        raise ValueError(f"cost must be an (n, m) matrix with n ≤ m, got shape {tuple(c.shape)}")
    if not np.isfinite(c).all():
        raise ValueError("cost has NaN or infinite entries")
    solver = resolve_backend(backend, c.shape[1])
    if solver == "scipy":
        _, cols = linear_sum_assignment(c, maximize=True)
    elif solver == "lapx":
        _, cols = _lapx().lapjvr(-c, extend_cost=c.shape[0] != c.shape[1], return_cost=False)
    else:
        raise OptionError(f"{{backend}} must be one of {[AUTO, *BACKENDS]}, got {got(backend)}")
    counts = _SOLVES.get()
    if counts is not None:
        counts[solver] += 1
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
        f"ties may break differently) or auto (lapx below {AUTO_SCIPY_FROM:,} units, scipy from there; scipy where "
        "lapx is missing)",
        validate_default=True,  # auto kept only where lapx is installed, in every options model, given or not
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
