"""The example inputs :func:`lmclab.trace.trace_spec` runs a model on: one tensor, a sequence of positional
inputs (``(ids, mask, decoder_ids)``) or a mapping of keyword inputs (``{"input_ids": …, "attention_mask": …}``,
as a Hugging Face model takes them). ``torch.export`` takes positional and keyword inputs as they are; the
``torch.fx`` graph's placeholders are ``forward``'s parameters in order, so keyword inputs are put in their
places there, the parameters between them taking their defaults."""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

Inputs = torch.Tensor | Sequence[Any] | Mapping[str, Any]


def split_inputs(model: nn.Module, example_inputs: Inputs) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``example_inputs`` as positional and keyword inputs; one line naming ``example_inputs`` otherwise."""
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,), {}
    if isinstance(example_inputs, Mapping):
        if not all(isinstance(k, str) for k in example_inputs):
            raise TypeError("example_inputs: a mapping of keyword inputs needs names (str) as keys")
        return (), dict(example_inputs)
    if isinstance(example_inputs, Sequence) and not isinstance(example_inputs, str):
        return tuple(example_inputs), {}
    raise TypeError(
        f"example_inputs: expected a tensor, a sequence of inputs or a mapping of keyword inputs for "
        f"{type(model).__name__}, got {type(example_inputs).__name__}"
    )


def positional(model: nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[Any, ...]:
    """``args`` then ``kwargs`` in the order of ``forward``'s parameters (defaults between them)."""
    if not kwargs:
        return args
    params = [
        p
        for p in inspect.signature(model.forward).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    names = [p.name for p in params]
    if unknown := sorted(set(kwargs) - set(names[len(args) :])):
        raise TypeError(f"example_inputs: {type(model).__name__}.forward takes no input {unknown[0]!r} by position")
    last = max(names.index(k) for k in kwargs)
    out = list(args)
    for p in params[len(args) : last + 1]:
        if p.name not in kwargs and p.default is p.empty:
            raise TypeError(f"example_inputs: {type(model).__name__}.forward needs its input {p.name!r}")
        out.append(kwargs.get(p.name, p.default))
    return tuple(out)


def shapes(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
    """The shapes of the inputs, for a message (``[(2, 8)]``, ``{'input_ids': (2, 8)}``)."""

    def shape(x: Any) -> Any:
        return tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__

    named = {k: shape(v) for k, v in kwargs.items()}
    if named and not args:
        return str(named)
    return str([shape(x) for x in args]) + (f" and {named}" if named else "")


def absent(model: nn.Module, kwargs: Mapping[str, Any]) -> dict[str, Any] | None:
    """The arguments of ``forward`` a mapping of keyword inputs leaves out, at their defaults (``torch.fx``'s
    ``concrete_args``: it then follows the branch taken on them, as the forward pass does); None for
    positional inputs."""
    if not kwargs:
        return None
    params = inspect.signature(model.forward).parameters.values()
    return {p.name: p.default for p in params if p.name not in kwargs and p.default is not p.empty}
