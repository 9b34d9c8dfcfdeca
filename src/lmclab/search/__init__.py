"""Permutation search methods, one module each, behind one call: :func:`find_permutation`.

Every method sees only a :class:`SearchProblem` (spec, both parameter dicts, a model skeleton for
``functional_call``, training data) and returns a :class:`SearchResult`; none branches on the
architecture.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from lmclab.archs import build_model, get_arch
from lmclab.data import Split
from lmclab.search.activation_matching import activation_matching
from lmclab.search.result import SearchResult
from lmclab.search.weight_matching import weight_matching
from lmclab.spec import PermutationSpec, identity_permutation


@dataclass(frozen=True)
class SearchProblem:
    """Align θb to θa: ``params_a``/``params_b`` on ``device``; ``train`` for data-driven methods."""

    arch: str
    config: Any
    params_a: Mapping[str, Tensor]
    params_b: Mapping[str, Tensor]
    train: Split
    device: torch.device

    @property
    def spec(self) -> PermutationSpec:
        return get_arch(self.arch).permutation_spec(self.config)

    def model(self) -> nn.Module:
        return build_model(self.arch, self.config).to(self.device)


def _identity(problem: SearchProblem, *, seed: int) -> SearchResult:
    """No permutation: the naive ("w/o") baseline."""
    return SearchResult(identity_permutation(problem.spec.group_sizes(problem.params_a)), {"seconds": 0.0})


def _wm(problem: SearchProblem, *, seed: int, max_iter: int = 100, tol: float = 1e-7) -> SearchResult:
    return weight_matching(problem.spec, problem.params_a, problem.params_b, max_iter=max_iter,
                           tol=tol, generator=torch.Generator().manual_seed(seed))


def _am(problem: SearchProblem, *, seed: int, statistic: str = "cross_moment",
        batch_size: int = 1000, max_samples: int | None = None) -> SearchResult:
    points = get_arch(problem.arch).activation_points(problem.config)
    return activation_matching(problem.spec, problem.params_a, problem.params_b, model=problem.model(),
                               points=points, data=problem.train, statistic=statistic,
                               batch_size=batch_size, max_samples=max_samples)


METHODS: dict[str, Callable[..., SearchResult]] = {"identity": _identity, "wm": _wm, "am": _am}


def check_method(method: str, options: Mapping[str, Any] | None = None, *,
                 key: str = "permute.methods") -> None:
    """One-line errors for an unknown method (named by the params ``key`` listing it) or option."""
    if method not in METHODS:
        raise ValueError(f"{key}: unknown method {method!r}; expected one of {sorted(METHODS)}")
    accepted = [p for p in inspect.signature(METHODS[method]).parameters if p not in ("problem", "seed")]
    unknown = sorted(set(options or {}) - set(accepted))
    if unknown:
        raise ValueError(f"permute.{method}: unknown option(s) {unknown}; expected some of {accepted}")


def find_permutation(method: str, problem: SearchProblem, *, seed: int,
                     options: Mapping[str, Any] | None = None) -> SearchResult:
    """Run ``method`` with its ``options`` (the ``permute.<method>`` block of params.yaml)."""
    check_method(method, options)
    start = time.perf_counter()
    result = METHODS[method](problem, seed=seed, **dict(options or {}))
    result.stats.setdefault("seconds", time.perf_counter() - start)
    return result
