"""Registry of architectures. Each module declares ``Config``, ``Model``, ``permutation_spec``
and ``activation_points``; adding an architecture is one file and one line here.
:func:`search_problem` hands a search what it needs of one (the searches never see the registry)."""

from __future__ import annotations

import dataclasses
from types import ModuleType
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from lmclab.archs import mixer, mlp, resnet20, resnet50, traced, vgg

if TYPE_CHECKING:
    from lmclab.search import SearchProblem

ARCHS: dict[str, ModuleType] = {"mlp": mlp, "vgg": vgg, "resnet20": resnet20, "resnet50": resnet50,
                               "traced": traced, "mixer": mixer}


def get_arch(name: str) -> ModuleType:
    """The architecture module called ``name``; one-line error naming ``model.arch`` otherwise."""
    if name not in ARCHS:
        raise ValueError(f"model.arch: unknown architecture {name!r}; expected one of {sorted(ARCHS)}")
    return ARCHS[name]


def make_config(arch: str, **fields: Any) -> Any:
    """The frozen config of ``arch`` from plain values (lists become tuples)."""
    cls = get_arch(arch).Config
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ValueError(f"model: {arch} takes no option(s) {unknown}; expected some of {sorted(known)}")
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})


def build_model(arch: str, config: Any, seed: int | None = None) -> nn.Module:
    """The ``nn.Module``; with ``seed``, its initialisation is drawn from that seed only."""
    module = get_arch(arch)
    if seed is None:
        return module.Model(config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return module.Model(config)


def search_problem(arch: str, config: Any, params_a: Mapping[str, torch.Tensor], params_b: Mapping[str, torch.Tensor],
                   *, device: torch.device, **given: Any) -> SearchProblem:
    """The :class:`~lmclab.search.SearchProblem` of two ``arch`` models: its permutation spec, a model
    skeleton on ``device`` and its activation points; ``given``: ``train``, ``test``, ``repair``, ``progress``."""
    from lmclab.search import SearchProblem

    module = get_arch(arch)
    return SearchProblem(module.permutation_spec(config), params_a, params_b,
                         model=build_model(arch, config).to(device), points=module.activation_points(config),
                         device=device, **given)
