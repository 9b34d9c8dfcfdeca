"""Check a whole run's parameters up front, so bad input fails in seconds, not after training."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lmclab.archs import get_arch, make_config
from lmclab.augment import resolve_augment
from lmclab.data import check_name
from lmclab.device import resolve_device
from lmclab.metrics import lambda_grid
from lmclab.search import check_method


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


def check_params(*, data: Mapping, model: Mapping, train: Mapping, permute: Mapping,
                 measure: Mapping, device: str) -> None:
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
    if not isinstance(permute["methods"], list) or not permute["methods"]:
        raise ValueError(f"permute.methods must be a non-empty list, got {permute['methods']!r}")
    for method in permute["methods"]:
        if not isinstance(permute.get(method), dict):
            raise ValueError(f"permute.{method}: missing options block (write {{}} for the defaults)")
        check_method(method, permute[method])
    lambda_grid(measure["num_lambdas"])
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
