"""The weights of the models a call compares, read once for every method (the paper's Section 2 compares θa
and θb entry by entry): real tensors (not on the ``meta`` device), finite, of one set of names and shapes,
and in one precision — the place where the models are prepared for a search, a merge or a curve.

A NaN or an infinity in one weight makes every weight-matching cost, every average ``λ·θa + (1−λ)·θb``
(``0·∞`` is NaN at the endpoints) and every loss of the path undefined, so such a model is refused, naming
its argument and the tensor; there is nothing meaningful to compute with it.

The precision the models are compared in is chosen from their floating dtypes (:func:`compute_dtype`):
``float64`` when any of them holds a float64 tensor, else ``float32`` — for a float32 pair, for one model in
bfloat16 or float16 beside one in float32, and for a pair in one half precision alike: a weight-matching
cost sums products over a whole layer, which float16 overflows and bfloat16's 8-bit mantissa rounds to
ties. What a call returns as a model goes back to its input's own dtype (:meth:`Weights.own`): an aligned
model to its own, a merged one to θa's (``models[0]``'s); the caller's models are never changed.

>>> import torch
>>> a = {"w": torch.ones(2, dtype=torch.bfloat16), "n": torch.tensor(3)}
>>> b = {"w": torch.zeros(2, dtype=torch.float16), "n": torch.tensor(3)}
>>> dtype = compute_dtype([a, b])                                   # two half precisions: float32
>>> in_dtype(a, dtype)["w"].dtype, in_dtype(a, dtype)["n"].dtype    # integer buffers as they are
(torch.float32, torch.int64)
>>> compute_dtype([a, {"w": torch.zeros(2, dtype=torch.float64)}])
torch.float64
>>> check_weights({"w": torch.tensor([0.0, float("nan"), -float("inf")])}, "model_b")
Traceback (most recent call last):
ValueError: model_b: tensor 'w' has 1 NaN entry and 1 -inf entry; expected finite weights
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

import torch
from torch import Tensor

from lmclab.core.spec import Params, with_metadata


def check_weights(state: Mapping[str, Tensor], name: str) -> None:
    """One line naming ``name`` (an argument, or on the command a file) and the first tensor of ``state`` that
    holds no values (the ``meta`` device) or a NaN, +inf or −inf entry."""
    for key, value in state.items():
        if value.is_meta:
            raise ValueError(
                f"{name}: tensor {key!r} is on the meta device (shapes without values); load its weights first"
            )
        if (value.is_floating_point() or value.is_complex()) and not bool(torch.isfinite(value).all()):
            raise ValueError(f"{name}: tensor {key!r} has {_non_finite(value)}; expected finite weights")


def _non_finite(value: Tensor) -> str:
    """``2 NaN entries and 1 +inf entry``: what is not finite in ``value``, by kind."""
    flat = torch.view_as_real(value).flatten() if value.is_complex() else value.flatten()
    counts = {"NaN": int(flat.isnan().sum()), "+inf": int(flat.isposinf().sum()), "-inf": int(flat.isneginf().sum())}
    return " and ".join(f"{n} {kind} entr{'y' if n == 1 else 'ies'}" for kind, n in counts.items() if n)


def compute_dtype(params: Iterable[Mapping[str, Tensor]]) -> torch.dtype:
    """The dtype models are compared in: ``float64`` when any floating tensor of ``params`` is float64, else
    ``float32`` (half precisions — float16, bfloat16 — and float32 alike; module docstring)."""
    found = {v.dtype for p in params for v in p.values() if v.is_floating_point()}
    return torch.float64 if torch.float64 in found else torch.float32


def in_dtype(params: Mapping[str, Tensor], dtype: torch.dtype) -> Params:
    """``params`` with every floating tensor in ``dtype`` (new tensors where it differs; integer buffers, such
    as BatchNorm's counter, as they are)."""
    return with_metadata({k: v.to(dtype) if v.is_floating_point() else v for k, v in params.items()}, params)


class Weights(NamedTuple):
    """The models read by :func:`lmclab.api.inputs.read_weights`: their state dicts in the compute dtype, and
    each one's own floating dtypes (tensor name → dtype), which :meth:`own` restores."""

    params: list[Params]
    dtypes: list[dict[str, torch.dtype]]

    def own(self, index: int, params: Mapping[str, Tensor]) -> Params:
        """``params`` (a model of the same tensors) with each floating tensor in model ``index``'s own dtype."""
        own = self.dtypes[index]
        return with_metadata(
            {k: v.to(own[k]) if v.is_floating_point() and k in own else v for k, v in params.items()}, params
        )


def check_same_shapes(
    reference: Mapping[str, Tensor], params: Mapping[str, Tensor], what: str, reference_what: str, shapes: bool = True
) -> None:
    """One line naming ``what``, the tensor and both shapes unless ``params`` holds exactly ``reference``'s
    tensor names with the same shapes (two models to align, or a model file and the module it runs in; the names
    alone without ``shapes``)."""
    missing, extra = sorted(set(reference) - set(params)), sorted(set(params) - set(reference))
    if missing or extra:
        raise ValueError(
            f"{what}: tensor names differ from {reference_what}'s (missing {missing[:3]}, extra {extra[:3]})"
        )
    for name, value in reference.items():
        if shapes and tuple(params[name].shape) != tuple(value.shape):
            raise ValueError(
                f"{what}: tensor {name!r} has shape {tuple(params[name].shape)}, "
                f"{reference_what}'s {tuple(value.shape)}"
            )
