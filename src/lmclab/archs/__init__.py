"""Registry of architectures. Each module declares ``Config`` (an options model, :mod:`lmclab.archs.base`:
each option's type, range, default and meaning), ``Model``, ``permutation_spec`` and ``activation_points``;
adding an architecture is one file and one line here (and its block ``model.<name>`` in params.yaml). A
module that sets ``OBJECTIVE`` is reached by ``train.objective`` of that name instead of ``model.arch``.
The searches never see the registry: :func:`lmclab.search.registered.search_problem` hands them
what they need of one."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch
from torch import nn

from lmclab.archs import gpt, mae, mixer, mlp, resnet20, resnet50, traced, vgg, vit
from lmclab.archs.base import DATA_FIELDS, interface
from lmclab.core.options import OptionError, got

ARCHS: dict[str, ModuleType] = {
    "mlp": mlp,
    "vgg": vgg,
    "resnet20": resnet20,
    "resnet50": resnet50,
    "traced": traced,
    "mixer": mixer,
    "vit": vit,
    "gpt": gpt,  # a decoder-only language model: reads token windows (data.name: pydoc)
    "mae": mae,  # a ViT pretrained as a masked autoencoder: reached by train.objective: mae
}


def get_arch(arch: str) -> ModuleType:
    """The architecture module called ``arch``; a one-line :class:`OptionError` naming ``arch`` otherwise."""
    if arch not in ARCHS:
        raise OptionError(f"{{arch}}: unknown architecture {got(arch)}; expected one of {got(sorted(ARCHS))}")
    return ARCHS[arch]


def make_config(arch: str, **fields: Any) -> Any:
    """The frozen config of ``arch`` from plain values (lists become tuples); a one-line
    :class:`OptionError` naming the field otherwise."""
    cls = get_arch(arch).Config
    unknown = sorted(set(fields) - set(cls.model_fields))
    if unknown:
        raise OptionError(
            f"{{config}}: {arch} takes no option(s) {got(unknown)}; expected some of {got(sorted(cls.model_fields))}"
        )
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})


def arch_options(arch: str) -> dict[str, Any]:
    """The fields of ``arch``'s config that are its own options (not the data's)."""
    return {k: f for k, f in get_arch(arch).Config.model_fields.items() if k not in DATA_FIELDS}


def build_model(arch: str, config: Any, seed: int | None = None) -> nn.Module:
    """The ``nn.Module``; with ``seed``, its initialisation is drawn from that seed only."""
    module = get_arch(arch)
    return module.Model(config) if seed is None else seeded_model(module.Model, config, seed)


def circuit_model(arch: str, config: Any) -> nn.Module:
    """``arch``'s model of heads twice as wide, the circuit space's (:mod:`lmclab.analysis.circuits`); a
    one-line :class:`OptionError` naming ``circuits`` for an architecture that has none."""
    widen = interface(get_arch(arch)).circuit_config
    if widen is None:
        raise OptionError(
            f"{{circuits}}: {arch} has no model of heads twice as wide (gpt with learned positions and vit have)"
        )
    return get_arch(arch).Model(widen(config))


def seeded_model(model_cls: Callable[[Any], nn.Module], config: Any, seed: int) -> nn.Module:
    """``model_cls(config)`` initialised from ``seed`` only (the global generator is left as it was)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return model_cls(config)
