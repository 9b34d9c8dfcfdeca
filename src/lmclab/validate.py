"""Check a whole run's parameters up front, so bad input fails in seconds, not after training."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from lmclab.alignment import check_mode
from lmclab.archs import get_arch, make_config
from lmclab.augment import resolve_augment
from lmclab.data import check_name
from lmclab.device import resolve_device
from lmclab.landscape import plane_grid
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


def check_seed_lists(key: str, groups: Any, seeds: list[int], size: int | None) -> None:
    """Every group lists distinct seeds of ``train.seeds`` (``size`` of them, if given)."""
    if not isinstance(groups, list) or not groups:
        raise ValueError(f"{key} must be a non-empty list, got {groups!r}")
    for group in groups:
        if not isinstance(group, list) or len(set(group)) != len(group) or (size and len(group) != size):
            raise ValueError(f"{key}: {group!r} is not a list of {size or 'several'} different seeds")
        missing = [s for s in group if s not in seeds]
        if missing:
            raise ValueError(f"{key}: {group} names seed(s) {missing} not in train.seeds {seeds}")


def check_methods(key: str, methods: Any, permute: Mapping) -> None:
    """Known methods, each with an options block ``permute.<method>`` of known options."""
    if not isinstance(methods, list) or not methods:
        raise ValueError(f"{key} must be a non-empty list, got {methods!r}")
    for method in methods:
        check_method(method, key=key)
        if not isinstance(permute.get(method), dict):
            raise ValueError(f"permute.{method}: missing options block (write {{}} for the defaults)")
        check_method(method, permute[method])


def check_gammas(gammas: Any) -> None:
    """R_γ thresholds: a non-empty list of numbers in [0, 1]."""
    if not isinstance(gammas, list) or not gammas or not all(
            isinstance(g, (int, float)) and not isinstance(g, bool) and 0 <= g <= 1 for g in gammas):
        raise ValueError(f"measure.gammas must be a non-empty list of numbers in [0, 1], got {gammas!r}")


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
                 measure: Mapping, device: str, three: Mapping | None = None,
                 merge_many: Mapping | None = None) -> None:
    """Raise a one-line ``ValueError`` naming the first bad parameter."""
    check_data(data)
    get_arch(model["arch"])
    opts = model.get(model["arch"]) or {}
    if not isinstance(opts, Mapping):
        raise ValueError(f"model.{model['arch']}: expected a block of options, got {opts!r}")
    for shape in ((1, 28, 28), (3, 32, 32)):
        make_config(model["arch"], input_shape=shape, num_classes=10, **opts)
    if not isinstance(train["seeds"], list) or not train["seeds"]:
        raise ValueError(f"train.seeds must be a non-empty list of integers, got {train['seeds']!r}")
    for key in ("epochs", "batch_size"):
        if not isinstance(train[key], int) or train[key] < 1:
            raise ValueError(f"train.{key} must be a positive integer, got {train[key]!r}")
    if not train["lr"] > 0:
        raise ValueError(f"train.lr must be positive, got {train['lr']!r}")
    check_training(train)
    check_pairs(permute["pairs"], train["seeds"])
    check_methods("permute.methods", permute["methods"], permute)
    check_search_batches(permute, data.get("max_train"))
    lambda_grid(measure["num_lambdas"])
    if three is not None:
        check_seed_lists("three.triples", three["triples"], train["seeds"], 3)
        check_methods("three.methods", three["methods"], permute)
        plane_grid(three["resolution"], three["margin"])
    if merge_many is not None:
        check_seed_lists("merge_many.seeds", [merge_many["seeds"]], train["seeds"], None)
        if len(merge_many["seeds"]) < 2 or merge_many["max_iter"] < 1 or merge_many["tol"] < 0:
            raise ValueError("merge_many: needs at least 2 seeds, max_iter ≥ 1 and tol ≥ 0, got "
                             f"{merge_many!r}")
    check_gammas(measure["gammas"])
    splits = measure["taylor_splits"]
    if not isinstance(splits, list) or not splits or not set(splits) <= {"train", "test"}:
        raise ValueError(f"measure.taylor_splits must be a non-empty list of train/test, got {splits!r}")
    check_mode(measure["conv_spectrum"])
    check_bn_repair(measure)
    resolve_device(device)


def check_data(data: Mapping) -> None:
    check_name(data["name"])
    size = data.get("image_size", 224)
    if not isinstance(size, int) or size < 28:
        raise ValueError(f"data.image_size must be an integer of at least 28 pixels, got {size!r}")


def check_training(train: Mapping) -> None:
    """The optimiser, schedule and augmentation options (train.*) of issue 3."""
    from lmclab.training import OPTIMIZERS, SCHEDULES

    for key, allowed in (("optimizer", OPTIMIZERS), ("schedule", SCHEDULES)):
        if train[key] not in allowed:
            raise ValueError(f"train.{key}: expected one of {allowed}, got {train[key]!r}")
    if not isinstance(train["momentum"], (int, float)) or not 0 <= train["momentum"] < 1:
        raise ValueError(f"train.momentum must be a number in [0, 1), got {train['momentum']!r}")
    if not isinstance(train["weight_decay"], (int, float)) or train["weight_decay"] < 0:
        raise ValueError(f"train.weight_decay must be a non-negative number, got {train['weight_decay']!r}")
    warmup = train["warmup_epochs"]
    if not isinstance(warmup, int) or not 0 <= warmup <= train["epochs"]:
        raise ValueError(f"train.warmup_epochs must be an integer between 0 and train.epochs, got {warmup!r}")
    resolve_augment(train["augment"], "")


def check_bn_repair(measure: Mapping) -> None:
    if not isinstance(measure["bn_repair"], bool):
        raise ValueError(f"measure.bn_repair must be true or false, got {measure['bn_repair']!r}")
    samples = measure["bn_repair_samples"]
    if samples is not None and (not isinstance(samples, int) or samples < 2):
        raise ValueError(f"measure.bn_repair_samples must be an integer ≥ 2 or null, got {samples!r}")
