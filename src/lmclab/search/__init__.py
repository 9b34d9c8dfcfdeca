"""Permutation search methods, one module each, behind one call: :func:`run_search`.

Each method is a pure function ``search(spec, params_a, params_b, *, …)`` whose keyword options are
its own typed model (``WMOptions``, ``AMOptions``, …: type, range, library default, meaning, in the
method's module). :func:`run_search` dispatches by name, checks the options against that model and
hands the method what its signature asks of a :class:`SearchProblem` (a model skeleton, activation
points, training data, a seeded generator, a learning-curve monitor); none branches on the
architecture or knows the architecture registry.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from tqdm import tqdm

from lmclab.core.assignment import counting_solves, solves_stat
from lmclab.core.batches import Batches
from lmclab.core.data import Split
from lmclab.core.evaluate import evaluate
from lmclab.core.merge import aligned_midpoint
from lmclab.core.metrics import l2_distance
from lmclab.core.options import OptionError, Options, got
from lmclab.core.progress import progress_bar
from lmclab.core.spec import Params, Permutation, PermutationSpec
from lmclab.search import activation_matching, identity, ste, ste_sinkhorn, weight_matching, wm_sinkhorn
from lmclab.search.midpoint import Monitor
from lmclab.search.result import SearchResult

# name -> search function (the submodules keep their names); ``METHODS[name].options`` is its options model
METHODS: dict[str, Callable[..., SearchResult]] = {
    "identity": identity.identity,
    "wm": weight_matching.weight_matching,
    "am": activation_matching.activation_matching,
    "ste": ste.ste,
    "wm_sinkhorn": wm_sinkhorn.wm_sinkhorn,
    "ste_sinkhorn": ste_sinkhorn.ste_sinkhorn,
}


@dataclass(frozen=True)
class SearchProblem:
    """Align θb to θa: ``params_a``/``params_b`` (on ``device``) under ``spec``.

    ``model`` is a skeleton run with ``functional_call`` (AM, STE, Sinkhorn STE and the learning
    curves); ``points`` the activation points of AM (group -> module names); ``train`` the data of
    data-driven methods: a ``Split``, or for those that stream it (:func:`streams_data`) also a
    ``DataLoader``. ``test`` (optional) lets iterative methods record learning curves of the
    merged model; ``repair`` (optional) maps a merged parameter dict to one with repaired BatchNorm
    statistics before it is evaluated there; ``progress`` shows a bar per search epoch.
    ``lmclab.search.registered.search_problem`` builds one for a registered architecture."""

    spec: PermutationSpec
    params_a: Mapping[str, Tensor]
    params_b: Mapping[str, Tensor]
    model: nn.Module | None = None
    points: Mapping[str, list[str]] | None = None
    train: Batches | None = None
    device: torch.device = torch.device("cpu")
    test: Split | None = None
    repair: Callable[[Params], Params] | None = None
    progress: bool = False


def check_method(method: str, options: Mapping[str, Any] | Options | None = None) -> Options:
    """``options`` validated by ``method``'s options model, or a one-line :class:`OptionError` naming
    the argument (``method``, ``options`` or the option); options it validated already (an instance of that
    model, which is frozen) are trusted as they are: each entry point validates once."""
    if method not in METHODS:
        raise OptionError(f"{{method}}: unknown method {got(method)}; expected one of {got(sorted(METHODS))}")
    model = METHODS[method].options
    return options if isinstance(options, model) else model.check(options or {})


def _registered(method: str) -> Callable[..., Any]:
    """The search function of ``method``, a pair method (:data:`METHODS`) or an n-model one."""
    from lmclab.search.many_methods import MANY_METHODS

    if method not in METHODS and method not in MANY_METHODS:
        known = [*METHODS, *MANY_METHODS]
        raise OptionError(f"{{method}}: unknown method {got(method)}; expected one of {got(known)}")
    return METHODS.get(method) or MANY_METHODS[method]


def _requires(method: str, argument: str) -> bool:
    parameter = inspect.signature(_registered(method)).parameters.get(argument)
    return parameter is not None and parameter.default is inspect.Parameter.empty


def needs_data(method: str) -> bool:
    """Whether ``method`` (a pair or n-model method) reads training data: its search function has a
    ``data`` parameter without a default (activation matching, STE, CCA Merge, ZipIt!, …)."""
    return _requires(method, "data")


def streams_data(method: str) -> bool:
    """Whether ``method`` reads its training data in one pass of batches, so that a ``DataLoader`` is
    streamed rather than held in memory: its ``data`` parameter takes :data:`lmclab.core.batches.Batches`
    (activation matching, CCA Merge, ZipIt!); the others (STE, Sinkhorn STE) take a ``Split``."""
    parameter = inspect.signature(inspect.unwrap(_registered(method)), eval_str=True).parameters.get("data")
    return parameter is not None and parameter.annotation == Batches


def needs_model(method: str) -> bool:
    """Whether ``method`` runs the models forward: its search function has a ``model`` parameter
    without a default (the skeleton it calls with ``functional_call``)."""
    return _requires(method, "model")


def run_search(
    method: str, problem: SearchProblem, *, seed: int, options: Mapping[str, Any] | None = None
) -> SearchResult:
    """Run ``method`` on ``problem`` with ``options`` (its keyword options, e.g. ``{"max_iter": 5}``);
    ``seed`` seeds its generator. ``stats['seconds']`` excludes learning-curve monitoring."""
    checked = check_method(method, options)
    search = METHODS[method]
    start = time.perf_counter()
    inputs = {**_inputs(search, problem, seed), "options": checked}
    trusted = inspect.unwrap(search)  # validated above: the @takes wrapper would validate again
    with kept_modes(problem.model), counting_solves() as solves:
        if "monitor" in inspect.signature(search).parameters:
            result = _monitored(problem, trusted, **inputs)
        else:  # the loops that know no monitor tick a bar of their own steps (sweeps, batches)
            with progress_bar(method, "step", problem.progress):
                result = trusted(problem.spec, problem.params_a, problem.params_b, **inputs)
    result.stats.setdefault("seconds", time.perf_counter() - start)
    result.stats.update(solves_stat(checked, solves))
    return result


@contextmanager
def kept_modes(model: nn.Module | None) -> Iterator[None]:
    """Every submodule of ``model`` back in the train/eval mode it had, however the method ran it (AM and
    the evaluations put it in eval mode, STE's steps in train mode): the caller's module is never changed."""
    modes = [(m, m.training) for m in model.modules()] if model is not None else []
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


def _inputs(search: Callable[..., SearchResult], problem: SearchProblem, seed: int) -> dict[str, Any]:
    """What ``search``'s signature asks of the problem besides the spec and both parameter dicts."""
    fields = {"model": "model", "points": "points", "data": "train"}  # argument -> SearchProblem field
    wanted = inspect.signature(search).parameters
    inputs: dict[str, Any] = {"generator": torch.Generator().manual_seed(seed)} if "generator" in wanted else {}
    for argument, field in fields.items():
        if argument in wanted:
            inputs[argument] = getattr(problem, field)
            if inputs[argument] is None and wanted[argument].default is inspect.Parameter.empty:
                raise ValueError(f"SearchProblem.{field}: {search.__name__} needs it, got None")
    return inputs


def _monitor(problem: SearchProblem) -> Monitor:
    """Learning-curve row for a hard permutation: ``l2`` = ‖θa − π(θb)‖ and, with a test split,
    the merged midpoint's ``test_loss``/``test_acc`` (the paper's Figure 6)."""
    spec, model = problem.spec, problem.model
    if problem.test is not None and model is None:
        raise ValueError("SearchProblem.model: the learning curve on SearchProblem.test needs it, got None")

    def row(perm: Permutation) -> dict[str, float]:
        permuted_b, merged = aligned_midpoint(spec, problem.params_a, problem.params_b, perm)
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
