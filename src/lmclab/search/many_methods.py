"""The n-model methods behind one call, :func:`run_many`, as :func:`lmclab.search.run_search`
is for pairs.

The *universe* methods (:data:`UNIVERSE`: MergeMany, C2M3, sync, star) map every one of N models into one
frame by a permutation per model and group and return a :class:`~lmclab.search.universe.UniverseResult`
(``perms``, ``merged``, ``stats``); the *transform* methods (CCA Merge, ZipIt!) merge through general
merge/unmerge matrices from the models' activations and return a
:class:`~lmclab.core.transform.TransformResult` (``merges``, ``unmerges``, ``merged``, ``heads``,
``stats``). Each method's keyword options are its own typed model (``MANY_METHODS[name].options``: type,
range, library default, meaning, in the method's module), which the pipeline's schema embeds as
``merge_many.<method>``. None branches on the architecture.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from lmclab.core.assignment import counting_solves, solves_stat
from lmclab.core.batches import Batches
from lmclab.core.options import OptionError, Options, got
from lmclab.core.progress import progress_bar
from lmclab.core.spec import PermutationSpec
from lmclab.core.transform import TransformResult
from lmclab.search import c2m3, cca_merge, merge_many, star, sync, zipit
from lmclab.search.universe import UniverseResult

# name -> n-model search function; ``MANY_METHODS[name].options`` is its options model
MANY_METHODS: dict[str, Callable[..., UniverseResult | TransformResult]] = {
    "merge_many": merge_many.merge_many,
    "c2m3": c2m3.c2m3,
    "sync": sync.sync,
    "star": star.star,
    "cca": cca_merge.cca_merge,
    "zipit": zipit.zipit,
}
# the methods that map into one frame by permutations: their pairwise maps are cycle-consistent
UNIVERSE = ("merge_many", "c2m3", "sync", "star")


def check_many(method: str, options: Mapping[str, Any] | Options | None = None) -> Options:
    """``options`` validated by ``method``'s options model, or a one-line :class:`OptionError` naming
    the argument (``method`` or the option); options it validated already are trusted as they are."""
    if method not in MANY_METHODS:
        raise OptionError(
            f"{{method}}: unknown n-model method {got(method)}; expected one of {got(list(MANY_METHODS))}"
        )
    model = MANY_METHODS[method].options
    return options if isinstance(options, model) else model.check(options or {})


def run_many(
    method: str,
    spec: PermutationSpec,
    params: Sequence[Mapping[str, Tensor]],
    *,
    seed: int,
    options: Mapping[str, Any] | None = None,
    model: nn.Module | None = None,
    points: Mapping[str, list[str]] | None = None,
    data: Batches | None = None,
    progress: bool = False,
) -> UniverseResult | TransformResult:
    """Run ``method`` on the N models ``params`` with ``options`` (its keyword options); ``seed`` seeds
    its generator. The transform methods read activations: they need ``model`` (a skeleton run with
    ``functional_call``), ``points`` (group -> module names, as activation matching's) and training
    ``data``. ``stats['seconds']`` is the method's own wall time; ``progress``: a bar over its steps (WM
    sweeps, MergeMany passes, batches of activations) on stderr."""
    checked = check_many(method, options)
    search, inputs = MANY_METHODS[method], {"model": model, "points": points, "data": data}
    wanted = inspect.signature(search).parameters
    given = {k: v for k, v in inputs.items() if k in wanted}
    missing = [k for k, v in given.items() if v is None]
    if missing:
        raise OptionError(f"{{{missing[0]}}}: {method} reads the models' activations and needs it, got None")
    if "generator" in wanted:
        given["generator"] = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    with progress_bar(method, "step", progress), counting_solves() as solves:
        result = inspect.unwrap(search)(spec, params, **given, options=checked)  # validated once, above
    result.stats.setdefault("seconds", time.perf_counter() - start)
    result.stats.update(solves_stat(checked, solves))
    return result
