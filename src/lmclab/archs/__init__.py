"""Registry of architectures. Each module declares ``Config``, ``Model``, ``permutation_spec``
and ``activation_points``; adding an architecture is one file and one line here.
The searches never see the registry: :func:`lmclab.search.registered.search_problem` hands them
what they need of one."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch
from torch import nn

from lmclab.archs import mae, mixer, mlp, resnet20, resnet50, traced, vgg, vit
from lmclab.core.options import OptionError, got

ARCHS: dict[str, ModuleType] = {
    "mlp": mlp,
    "vgg": vgg,
    "resnet20": resnet20,
    "resnet50": resnet50,
    "traced": traced,
    "mixer": mixer,
    "vit": vit,
    "mae": mae,  # a ViT pretrained as a masked autoencoder: reached by train.objective: mae
}


def get_arch(arch: str) -> ModuleType:
    """The architecture module called ``arch``; a one-line :class:`OptionError` naming ``arch`` otherwise."""
    if arch not in ARCHS:
        raise OptionError(f"{{arch}}: unknown architecture {got(arch)}; expected one of {got(sorted(ARCHS))}")
    return ARCHS[arch]


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
    return module.Model(config) if seed is None else seeded_model(module.Model, config, seed)


def seeded_model(model_cls: Callable[[Any], nn.Module], config: Any, seed: int) -> nn.Module:
    """``model_cls(config)`` initialised from ``seed`` only (the global generator is left as it was)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return model_cls(config)
