"""Inputs read batch by batch, from a :class:`~lmclab.core.data.Split` in memory or streamed from a
``DataLoader``, for the methods that only accumulate sums over the data (activation matching, the
feature statistics of CCA Merge and ZipIt!): one pass, nothing concatenated, so a data set larger
than memory can be used. Methods that need random access or several passes over the same samples
(STE's epochs and held-out split, REPAIR's fixed subset) take a ``Split``."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch
from torch import Tensor

from lmclab.core.data import Split, inputs_like

# a Split, or a re-iterable source of (input, target, …) batches such as a DataLoader
Batches = Split | Iterable[Any]


def streamed(data: Any) -> bool:
    """Whether ``data`` is read as a stream of batches: a re-iterable (a ``DataLoader``, a list of
    batches), not a ``Split``, a pair of tensors, or a one-shot iterator (read once to trace the spec)."""
    if isinstance(data, Pairs):
        return data.streams()
    if isinstance(data, Split | Tensor | dict) or not isinstance(data, Iterable):
        return False
    if isinstance(data, tuple) and len(data) == 2 and all(isinstance(t, Tensor) for t in data):
        return False
    return iter(data) is not data


def as_batch(item: Any, name: str = "data") -> tuple[Tensor, Tensor | None]:
    """``(inputs, targets)`` of one item of a stream: an ``(input, target, …)`` batch (of one sample,
    given a 0-d target: as a batch of one, as :func:`lmclab.as_split` reads it), or an input tensor
    alone (targets ``None``)."""
    if isinstance(item, Tensor):
        return item, None
    if isinstance(item, tuple | list) and len(item) >= 2:
        x, y = torch.as_tensor(item[0]), torch.as_tensor(item[1])
        return (x.unsqueeze(0), y.unsqueeze(0)) if y.dim() == 0 else (x, y)
    hint = " (wrap the data in lmclab.pairs(…, input_key=…, target_key=…))" if isinstance(item, Mapping) else ""
    raise TypeError(f"{name}: expected (input, target) batches or input tensors, got {type(item).__name__}{hint}")


def input_batches(
    data: Batches, *, batch_size: int, max_samples: int | None, like: Mapping[str, Tensor], name: str = "data"
) -> Iterator[Tensor]:
    """The inputs of the first ``max_samples`` samples of ``data`` (all: ``None``), as the model of the
    parameters ``like`` reads them (:func:`lmclab.core.data.inputs_like`), one batch at a time: slices
    of ``batch_size`` of a ``Split``; a stream's own batches, the last one cut at ``max_samples`` and the
    stream left unread after it. ``ValueError`` if nothing is read."""
    if isinstance(data, Split):
        n = len(data) if max_samples is None else min(max_samples, len(data))
        batches: Iterable[Tensor] = (data.x[lo : min(lo + batch_size, n)] for lo in range(0, n, batch_size))
    else:
        batches = (as_batch(item, name)[0] for item in data)
    seen = 0
    for x in batches:
        if max_samples is not None and seen + len(x) > max_samples:
            x = x[: max_samples - seen]
        if len(x):
            seen += len(x)
            yield inputs_like(x, like)
        if max_samples is not None and seen >= max_samples:
            break
    if seen == 0:
        raise ValueError(f"{name}: no samples to read (an empty data set, or max_samples of 0)")


class Pairs:
    """``data``'s items as ``(input, target)`` pairs: ``collate(item)``, or ``(item[input_key],
    item[target_key])`` of dict items (a Hugging Face batch: ``input_key="input_ids"``), read lazily, so
    that a ``DataLoader`` of dicts still streams (:func:`lmclab.pairs`)."""

    def __init__(
        self,
        data: Iterable[Any],
        *,
        input_key: str | None = None,
        target_key: str | None = None,
        collate: Callable[[Any], tuple[Any, Any]] | None = None,
    ) -> None:
        if (collate is None) == (input_key is None):
            raise ValueError("pairs: give either input_key (with target_key) or collate")
        if collate is not None and not callable(collate):
            raise TypeError(f"collate must be callable, got {type(collate).__name__}")
        if input_key is not None and target_key is None:
            raise ValueError("target_key: needed with input_key (the key of the targets in each batch)")
        self.data, self.keys, self.collate = data, (input_key, target_key), collate

    def _pair(self, item: Any) -> tuple[Any, Any]:
        if self.collate is not None:
            return self.collate(item)
        if not isinstance(item, Mapping):
            raise TypeError(f"input_key: expected dict batches, got {type(item).__name__}")
        for argument, key in zip(("input_key", "target_key"), self.keys, strict=True):
            if key not in item:
                raise ValueError(f"{argument}: no key {key!r} in a batch; its keys are {sorted(item)}")
        return item[self.keys[0]], item[self.keys[1]]

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        items = iter(self.data) if isinstance(self.data, Iterable) else (self.data[i] for i in range(len(self.data)))
        return (self._pair(item) for item in items)

    def streams(self) -> bool:
        """Whether the data underneath can be read again (a ``DataLoader``, not a one-shot iterator)."""
        return isinstance(self.data, Iterable) and iter(self.data) is not self.data
