"""Up-front checks of a search method's options (``permute.<method>`` in params.yaml).

Each data-driven method module declares ``RULES: {option: check}``; :func:`check_options` runs
the rules for the options given, so ``validate.py`` and the method itself raise the same
one-line error naming ``permute.<method>.<option>`` before any heavy work.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

Rule = Callable[[Any], str | None]  # returns what was expected, or None when the value is fine


def positive_int(value: Any) -> str | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
    return None if ok else "a positive integer"


def positive(value: Any) -> str | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and value > 0
    return None if ok else "a positive number"


def non_negative(value: Any) -> str | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and value >= 0
    return None if ok else "a non-negative number"


def unit_interval(value: Any) -> str | None:
    """In [0, 1): a momentum, a fraction that may be 0."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < 1
    return None if ok else "a number in [0, 1)"


def boolean(value: Any) -> str | None:
    return None if isinstance(value, bool) else "true or false"


def optional(rule: Rule) -> Rule:
    """``rule``, or null."""
    def check(value: Any) -> str | None:
        expected = None if value is None else rule(value)
        return None if expected is None else f"{expected} or null"

    return check


def one_of(*choices: str) -> Rule:
    def rule(value: Any) -> str | None:
        return None if value in choices else f"one of {list(choices)}"

    return rule


def check_options(method: str, rules: Mapping[str, Rule], options: Mapping[str, Any]) -> None:
    """Raise ``ValueError("permute.<method>.<key> must be …, got …")`` for the first bad option."""
    for key, value in options.items():
        if key in rules and (expected := rules[key](value)) is not None:
            raise ValueError(f"permute.{method}.{key} must be {expected}, got {value!r}")


def check_batch(method: str, batch_size: int, n_samples: int) -> None:
    """The batch must fit in the data it is drawn from (known only once the data is loaded)."""
    if batch_size > n_samples:
        raise ValueError(f"permute.{method}.batch_size must be at most the {n_samples} training "
                         f"samples available for the search, got {batch_size}")
