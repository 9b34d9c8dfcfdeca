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
from tqdm import tqdm

from lmclab.archs import build_model, get_arch
from lmclab.core.data import Split
from lmclab.core.evaluate import evaluate
from lmclab.core.merge import merge
from lmclab.core.metrics import l2_distance
from lmclab.search import ste as ste_module
from lmclab.search import ste_sinkhorn as ste_sinkhorn_module
from lmclab.search import wm_sinkhorn as wm_sinkhorn_module
from lmclab.search.activation_matching import activation_matching
from lmclab.search.midpoint import Monitor
from lmclab.search.options import check_options
from lmclab.search.result import SearchResult
from lmclab.search.weight_matching import weight_matching
from lmclab.core.spec import Params, Permutation, PermutationSpec, identity_permutation


@dataclass(frozen=True)
class SearchProblem:
    """Align θb to θa: ``params_a``/``params_b`` on ``device``; ``train`` for data-driven methods.

    ``test`` (optional) lets iterative methods record learning curves of the merged model;
    ``repair`` (optional) maps a merged parameter dict to one with repaired BatchNorm statistics
    before it is evaluated there; ``progress`` shows a bar per search epoch of iterative methods."""

    arch: str
    config: Any
    params_a: Mapping[str, Tensor]
    params_b: Mapping[str, Tensor]
    train: Split
    device: torch.device
    test: Split | None = None
    repair: Callable[[Params], Params] | None = None
    progress: bool = False

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


def _monitor(problem: SearchProblem) -> Monitor:
    """Learning-curve row for a hard permutation: ``l2`` = ‖θa − π(θb)‖ and, with a test split,
    the merged midpoint's ``test_loss``/``test_acc`` (the paper's Figure 6)."""
    spec, model = problem.spec, problem.model()

    def row(perm: Permutation) -> dict[str, float]:
        permuted_b, merged = merge(spec, problem.params_a, problem.params_b, perm)
        out = {"l2": l2_distance(spec, problem.params_a, permuted_b)}
        if problem.test is not None:
            merged = problem.repair(merged) if problem.repair is not None else merged
            loss, acc = evaluate(model, merged, problem.test)
            out |= {"test_loss": loss, "test_acc": acc}
        return out

    return row


def _monitored(problem: SearchProblem, search: Callable[..., SearchResult], **kwargs: Any) -> SearchResult:
    """Run ``search`` with the learning-curve monitor; ``seconds`` excludes the monitoring time,
    which is reported as ``monitor_seconds``."""
    row, spent = _monitor(problem), [0.0]
    bar = tqdm(desc=search.__name__, unit="epoch", disable=not problem.progress, leave=False)

    def timed(perm: Permutation) -> dict[str, float]:
        start = time.perf_counter()
        out = row(perm)
        spent[0] += time.perf_counter() - start
        bar.update()
        bar.set_postfix(l2=f"{out['l2']:.3f}", refresh=False)
        return out

    with bar:
        result = search(problem.spec, problem.params_a, problem.params_b, monitor=timed, **kwargs)
    result.stats["monitor_seconds"] = spent[0]
    result.stats["seconds"] -= spent[0]
    return result


def _ste(problem: SearchProblem, *, seed: int, optimizer: str = "adam", lr: float = 1e-3,
         momentum: float = 0.0, epochs: int = 5, batch_size: int = 512, holdout: float = 0.1,
         select: str = "holdout", wm_max_iter: int = 100) -> SearchResult:
    return _monitored(problem, ste_module.ste, model=problem.model(), data=problem.train,
                      generator=torch.Generator().manual_seed(seed), optimizer=optimizer, lr=lr,
                      momentum=momentum, epochs=epochs, batch_size=batch_size, holdout=holdout,
                      select=select, wm_max_iter=wm_max_iter)


def _wm_sinkhorn(problem: SearchProblem, *, seed: int, lr: float = 1.0, epochs: int = 10,
                 iterations: int = 100, tau: float = 1.0, sinkhorn_iters: int = 20,
                 select: str = "best", patience: int | None = None) -> SearchResult:
    return _monitored(problem, wm_sinkhorn_module.wm_sinkhorn, generator=torch.Generator().manual_seed(seed),
                      lr=lr, epochs=epochs, iterations=iterations, tau=tau, sinkhorn_iters=sinkhorn_iters,
                      select=select, patience=patience)


def _ste_sinkhorn(problem: SearchProblem, *, seed: int, optimizer: str = "adam", lr: float = 1.0,
                  weight_decay: float = 0.0, epochs: int = 5, batch_size: int = 512,
                  drop_last: bool = False, tau: float = 1.0, sinkhorn_iters: int = 20,
                  precision: str = "fp32") -> SearchResult:
    return _monitored(problem, ste_sinkhorn_module.ste_sinkhorn, model=problem.model(),
                      data=problem.train, generator=torch.Generator().manual_seed(seed),
                      optimizer=optimizer, lr=lr, weight_decay=weight_decay, epochs=epochs,
                      batch_size=batch_size, drop_last=drop_last, tau=tau, sinkhorn_iters=sinkhorn_iters,
                      precision=precision)


METHODS: dict[str, Callable[..., SearchResult]] = {
    "identity": _identity, "wm": _wm, "am": _am,
    "ste": _ste, "wm_sinkhorn": _wm_sinkhorn, "ste_sinkhorn": _ste_sinkhorn,
}
# value rules of the options, checked up front (names are checked against the adapter signature)
OPTION_RULES = {"ste": ste_module.RULES, "wm_sinkhorn": wm_sinkhorn_module.RULES,
                "ste_sinkhorn": ste_sinkhorn_module.RULES}


def check_method(method: str, options: Mapping[str, Any] | None = None, *,
                 key: str = "permute.methods") -> None:
    """One-line errors for an unknown method (named by the params ``key`` listing it) or option."""
    if method not in METHODS:
        raise ValueError(f"{key}: unknown method {method!r}; expected one of {sorted(METHODS)}")
    accepted = [p for p in inspect.signature(METHODS[method]).parameters if p not in ("problem", "seed")]
    unknown = sorted(set(options or {}) - set(accepted))
    if unknown:
        raise ValueError(f"permute.{method}: unknown option(s) {unknown}; expected some of {accepted}")
    check_options(method, OPTION_RULES.get(method, {}), options or {})


def find_permutation(method: str, problem: SearchProblem, *, seed: int,
                     options: Mapping[str, Any] | None = None) -> SearchResult:
    """Run ``method`` with its ``options`` (the ``permute.<method>`` block of params.yaml)."""
    check_method(method, options)
    start = time.perf_counter()
    result = METHODS[method](problem, seed=seed, **dict(options or {}))
    result.stats.setdefault("seconds", time.perf_counter() - start)
    return result
