"""A :class:`~lmclab.search.SearchProblem` for two models of a registered architecture: the one place
where the search layer meets the architecture registry (the methods themselves never do)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from lmclab.archs import build_model, get_arch
from lmclab.core.spec import PermutationSpec
from lmclab.search import SearchProblem


def search_problem(
    arch: str,
    config: Any,
    params_a: Mapping[str, torch.Tensor],
    params_b: Mapping[str, torch.Tensor],
    *,
    device: torch.device,
    spec: PermutationSpec | None = None,
    points: Mapping[str, Any] | None = None,
    **given: Any,
) -> SearchProblem:
    """The :class:`~lmclab.search.SearchProblem` of two ``arch`` models: its permutation spec, a model
    skeleton on ``device`` and its activation points (``spec`` and ``points`` given: those, e.g. the tracer's
    for orthogonal maps, :mod:`lmclab.archs.canonical`); ``given``: ``train``, ``test``, ``repair``, ``progress``."""
    module = get_arch(arch)
    return SearchProblem(
        spec if spec is not None else module.permutation_spec(config),
        params_a,
        params_b,
        model=build_model(arch, config).to(device),
        points=dict(points) if points is not None else module.activation_points(config),
        device=device,
        **given,
    )
