"""lmclab.core.options: a function that ``takes`` an options model lists the model's fields in its
signature, validates a call's values in one line naming the argument, and hands the validated model on."""

from __future__ import annotations

import inspect

import pytest

from lmclab.core.options import Count, OptionError, Options, Positive, option, takes


class Steps(Options):
    max_iter: Count = option(100, "sweeps at most")
    tol: Positive = option(1e-7, "stop when the objective gains less")


def _search(spec: str, *, options: Steps, seed: int = 0) -> tuple:
    return spec, options, seed


def test_takes_lists_the_fields_in_the_signature_and_passes_the_validated_options() -> None:
    search = takes(Steps)(_search)
    params = inspect.signature(search).parameters
    assert list(params) == ["spec", "max_iter", "tol", "seed"]
    assert params["max_iter"].default == 100 and params["max_iter"].annotation is int
    assert params["tol"].kind is inspect.Parameter.KEYWORD_ONLY and params["tol"].default == 1e-7
    spec, options, seed = search("s", max_iter=3, seed=2)
    assert (spec, options.max_iter, options.tol, seed) == ("s", 3, 1e-7, 2) and search.options is Steps
    with pytest.raises(OptionError, match=r"^max_iter must be a positive integer, got 0$"):
        search("s", max_iter=0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'maxiter'"):
        search("s", maxiter=3)
