"""The module an orthogonal alignment of a model with shared weights runs in: :func:`untied_copy` unties each
weight shared with a layer that reads a norm's gain (a head tied to the embeddings), so that the gain can be folded
into that reader alone (:func:`lmclab.core.canonical.fold_gains`)."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from torch import Tensor, nn

from lmclab.core.canonical import shared_parameters, tie, untie, untie_config
from lmclab.core.spec import PermutationSpec


def untied_copy(
    model: nn.Module, example_inputs: Tensor | Sequence[Any] | Mapping[str, Any]
) -> tuple[nn.Module, PermutationSpec]:
    """A copy of ``model`` with each weight it shares with a layer that reads a gain untied (whatever the gain's
    values: a gain of ones is still one the tracer folds) and its config marked untied, the same function, and
    the spec traced with every shared weight untied (``symmetry="orthogonal"``): the module an orthogonal
    alignment of a tied model's files runs in. Weights no gain reaches stay shared."""
    twin, traced = untied_trace(model, example_inputs)
    return twin, traced.spec


def untied_trace(model: nn.Module, example_inputs: Tensor | Sequence[Any] | Mapping[str, Any]) -> tuple[nn.Module, Any]:
    """:func:`untied_copy` with the whole trace (:class:`lmclab.trace.Traced`: the spec and the activation points
    of its groups)."""
    from lmclab.trace import trace  # the package imports its modules: at call time

    twin = copy.deepcopy(model)
    shared = shared_parameters(twin)
    for names in shared:  # traced untied: a gain may then fold into one of them
        untie(twin, names)
    traced = trace(twin, example_inputs, symmetry="orthogonal")
    readers = {name for read in traced.spec.gains.values() for name in read}
    for names in shared:
        if not readers.intersection(names):  # no gain folds into them: tied again, as the caller had them
            tie(twin, names)
    if any(readers.intersection(names) for names in shared):
        untie_config(twin)
    return twin, traced
