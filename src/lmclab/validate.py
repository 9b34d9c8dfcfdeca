"""Check a whole run's parameters up front, so bad input fails in seconds, not after training."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from lmclab.archs import make_config
from lmclab.data import check_name
from lmclab.device import resolve_device
from lmclab.metrics import lambda_grid
from lmclab.search import check_method
from lmclab.search.midpoint import n_heldout
from lmclab.search.ste import ste


def check_pairs(pairs: Any, seeds: list[int]) -> None:
    """Pairs are two distinct seeds, each one of ``train.seeds``."""
    if not isinstance(pairs, list) or not pairs:
        raise ValueError(f"permute.pairs must be a non-empty list of [seed_a, seed_b], got {pairs!r}")
    for pair in pairs:
        if not (isinstance(pair, list) and len(pair) == 2 and pair[0] != pair[1]):
            raise ValueError(f"permute.pairs: {pair!r} is not a pair of two different seeds")
        missing = [s for s in pair if s not in seeds]
        if missing:
            raise ValueError(f"permute.pairs: pair {pair} names seed(s) {missing} not in train.seeds {seeds}")


def check_search_batches(permute: Mapping, max_train: int | None) -> None:
    """Minibatch searches need ``batch_size`` ≤ the training images they draw from; known up
    front only when ``data.max_train`` caps the split (else checked when the data is loaded)."""
    if max_train is None:
        return
    for method in permute["methods"]:
        opts = permute.get(method) or {}
        if "batch_size" in opts and method in ("ste", "ste_sinkhorn"):
            holdout = opts.get("holdout", inspect.signature(ste).parameters["holdout"].default)
            available = max_train - n_heldout(max_train, holdout) if method == "ste" else max_train
            if opts["batch_size"] > available:
                raise ValueError(f"permute.{method}.batch_size must be at most the {available} training "
                                 f"samples available for the search, got {opts['batch_size']}")


def check_params(*, data: Mapping, model: Mapping, train: Mapping, permute: Mapping,
                 measure: Mapping, device: str) -> None:
    """Raise a one-line ``ValueError`` naming the first bad parameter."""
    check_name(data["name"])
    opts = {k: v for k, v in model.items() if k != "arch"}
    make_config(model["arch"], input_shape=(1, 28, 28), num_classes=10, **opts)
    if not isinstance(train["seeds"], list) or not train["seeds"]:
        raise ValueError(f"train.seeds must be a non-empty list of integers, got {train['seeds']!r}")
    for key in ("epochs", "batch_size"):
        if not isinstance(train[key], int) or train[key] < 1:
            raise ValueError(f"train.{key} must be a positive integer, got {train[key]!r}")
    if not train["lr"] > 0:
        raise ValueError(f"train.lr must be positive, got {train['lr']!r}")
    check_pairs(permute["pairs"], train["seeds"])
    if not isinstance(permute["methods"], list) or not permute["methods"]:
        raise ValueError(f"permute.methods must be a non-empty list, got {permute['methods']!r}")
    for method in permute["methods"]:
        if not isinstance(permute.get(method), dict):
            raise ValueError(f"permute.{method}: missing options block (write {{}} for the defaults)")
        check_method(method, permute[method])
    check_search_batches(permute, data.get("max_train"))
    lambda_grid(measure["num_lambdas"])
    resolve_device(device)
